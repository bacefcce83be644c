"""Projects: templates, create/list/get/update/delete, fork, members and invite links."""

from fastapi import APIRouter, status

from ide_server.components import Component
from ide_server.deps import CurrentUser, DbSession, ProjectMember, ProjectOwner, ProjectViewer, Public, SettingsDep
from ide_server.error_handlers import ERROR_RESPONSES
from ide_server.events import EventsDep
from ide_server.models import Project, Role
from ide_server.schemas import (
    InviteAccepted,
    InviteCreate,
    InviteCreated,
    InvitePreview,
    InvitePublic,
    MemberPublic,
    MemberUpdate,
    ProjectCreate,
    ProjectFork,
    ProjectPublic,
    ProjectUpdate,
    RandomId,
    SecretToken,
    TemplatePublic,
    UsernameParam,
)
from ide_server.services import projects, templates

router = APIRouter(prefix="/api", tags=["projects"], responses=ERROR_RESPONSES)
INVITE_PAGE = "/invite/"


def project_public(project: Project, role: Role | None) -> ProjectPublic:
    return ProjectPublic(
        id=project.id,
        name=project.name,
        template=project.template,
        visibility=project.visibility,
        forked_from=project.forked_from,
        created_at=project.created_at,
        role=role,
    )


@router.get("/templates", dependencies=[Public])
def list_templates() -> list[TemplatePublic]:
    return [TemplatePublic.model_validate(t) for t in templates.all_templates()]


@router.get("/projects")
def list_projects(user: CurrentUser, db: DbSession) -> list[ProjectPublic]:
    """The caller's projects: their own and those shared with them."""
    return [project_public(p, role) for p, role in projects.list_for_user(db, user)]


@router.post("/projects", status_code=status.HTTP_201_CREATED)
def create_project(body: ProjectCreate, user: CurrentUser, db: DbSession, settings: SettingsDep) -> ProjectPublic:
    project = projects.create(db, settings.projects_dir, user, body.name, body.template)
    return project_public(project, Role.owner)


@router.get("/projects/{project_id}")
def get_project(ctx: ProjectViewer) -> ProjectPublic:
    return project_public(ctx.project, ctx.role)


@router.patch("/projects/{project_id}")
def update_project(body: ProjectUpdate, ctx: ProjectOwner, db: DbSession) -> ProjectPublic:
    """Rename the project or change its visibility (private/public)."""
    project = projects.update(db, ctx.project, body.name, body.visibility)
    return project_public(project, ctx.role)


@router.delete("/projects/{project_id}", status_code=status.HTTP_204_NO_CONTENT)
def delete_project(ctx: ProjectOwner, db: DbSession, settings: SettingsDep) -> None:
    projects.delete(db, settings.projects_dir, ctx.project)


@router.post("/projects/{project_id}/fork", status_code=status.HTTP_201_CREATED)
def fork_project(
    body: ProjectFork, ctx: ProjectViewer, user: CurrentUser, db: DbSession, settings: SettingsDep
) -> ProjectPublic:
    """Copy a project you can read (yours, shared with you, or public) into a new private project."""
    project = projects.fork(db, settings.projects_dir, ctx.project, user, body.name)
    return project_public(project, Role.owner)


@router.get("/projects/{project_id}/members")
def list_members(ctx: ProjectMember, db: DbSession) -> list[MemberPublic]:
    return [MemberPublic(username=m.user.username, role=m.role) for m in projects.list_members(db, ctx.project)]


@router.patch("/projects/{project_id}/members/{username}")
def change_member_role(
    username: UsernameParam, body: MemberUpdate, ctx: ProjectOwner, db: DbSession, events: EventsDep
) -> MemberPublic:
    """Change a member's role; their open editors reconnect with the new role."""
    member = projects.change_role(db, ctx.project, username, body.role)
    if events is not None:
        events.access_changed(ctx.project.id, member.user_id)
    return MemberPublic(username=member.user.username, role=member.role)


@router.delete("/projects/{project_id}/members/{username}", status_code=status.HTTP_204_NO_CONTENT)
def remove_member(username: UsernameParam, ctx: ProjectOwner, db: DbSession, events: EventsDep) -> None:
    """Remove a member; their open editors are closed at once."""
    member = projects.remove_member(db, ctx.project, username)
    if events is not None:
        events.access_changed(ctx.project.id, member.user_id)


@router.get("/projects/{project_id}/invites")
def list_invites(ctx: ProjectOwner, db: DbSession) -> list[InvitePublic]:
    return [InvitePublic.model_validate(i) for i in projects.list_invites(db, ctx.project)]


@router.post("/projects/{project_id}/invites", status_code=status.HTTP_201_CREATED)
def create_invite(body: InviteCreate, ctx: ProjectOwner, user: CurrentUser, db: DbSession) -> InviteCreated:
    """Create an invite link carrying a role; the token is shown only in this answer."""
    invite, token = projects.create_invite(db, ctx.project, user, body.role)
    return InviteCreated(
        token=token, url=INVITE_PAGE + token, **InvitePublic.model_validate(invite).model_dump()
    )


@router.delete("/projects/{project_id}/invites/{invite_id}", status_code=status.HTTP_204_NO_CONTENT)
def revoke_invite(invite_id: RandomId, ctx: ProjectOwner, db: DbSession) -> None:
    projects.revoke_invite(db, ctx.project, invite_id)


@router.get("/invites/{token}")
def preview_invite(token: SecretToken, user: CurrentUser, db: DbSession) -> InvitePreview:
    """What accepting this invite would give: the project's name and the role."""
    invite, project = projects.find_invite(db, token)
    return InvitePreview(project_name=project.name, role=invite.role)


@router.post("/invites/{token}/accept")
def accept_invite(token: SecretToken, user: CurrentUser, db: DbSession) -> InviteAccepted:
    project, role = projects.accept_invite(db, token, user)
    return InviteAccepted(project=project_public(project, role))


component = Component(name="projects", router=router)
