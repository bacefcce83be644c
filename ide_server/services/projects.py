"""Projects, their members and invite links; and the one place that decides project access."""

import shutil
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import bindparam, func, select
from sqlalchemy.orm import Session

from ide_server import security
from ide_server.errors import Conflict, InvalidInput, NotAuthenticated, NotFound, PermissionDenied
from ide_server.models import Invite, Membership, Project, Role, User, Visibility
from ide_server.services import templates


@dataclass(frozen=True)
class ProjectAccess:
    """A project the caller may use, with the caller's role (None: a public project, not a member)."""

    project: Project
    user: User | None
    role: Role | None


def project_dir(projects_dir: Path, project_id: str) -> Path:
    return projects_dir / project_id


def role_of(db: Session, project_id: str, user: User | None) -> Role | None:
    if user is None:
        return None
    role = db.scalar(
        select(Membership.role).where(Membership.project_id == project_id, Membership.user_id == user.id)
    )
    return Role(role) if role is not None else None


# One query, built once (every project request runs it): the project and the caller's membership.
# An anonymous caller binds NULL, which equals no row.
_PROJECT_AND_ROLE = (
    select(Project, Membership.role)
    .outerjoin(Membership, (Membership.project_id == Project.id) & (Membership.user_id == bindparam("user_id")))
    .where(Project.id == bindparam("project_id"))
)


def authorize(db: Session, project_id: str, user: User | None, min_role: Role, public_read: bool) -> ProjectAccess:
    """The project if `user` holds `min_role` on it (or it is public and `public_read`).

    Projects the caller cannot see answer 404 (401 for anonymous callers), whether or not they
    exist, so ids of private projects don't leak. A visible project with too weak a role: 403.
    """
    found = db.execute(_PROJECT_AND_ROLE, {"project_id": project_id, "user_id": user.id if user else None}).first()
    project = found.Project if found is not None else None
    role = Role(found.role) if found is not None and found.role is not None else None
    is_public = project is not None and project.visibility == Visibility.public
    if project is None or (role is None and not is_public):
        if user is None:
            raise NotAuthenticated("sign in to open this project")
        raise NotFound("no such project")
    if role is not None and role.at_least(min_role):
        return ProjectAccess(project, user, role)
    if public_read and is_public and min_role == Role.viewer:
        return ProjectAccess(project, user, role)
    if user is None:
        raise NotAuthenticated("sign in to change this project")
    raise PermissionDenied(f"this needs the {min_role.value} role on the project")


def _clean_name(name: str) -> str:
    name = name.strip()
    if not name or len(name) > 100 or any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise InvalidInput("project name must be 1-100 printable characters")
    return name


def create(db: Session, projects_dir: Path, owner: User, name: str, template: str) -> Project:
    """A new private project owned by `owner`, with the template's starter files."""
    template_dir = templates.template_dir(template)
    project = Project(id=security.new_id(), name=_clean_name(name), template=template, visibility=Visibility.private)
    db.add(project)
    db.flush()  # the membership row references it
    db.add(Membership(project_id=project.id, user_id=owner.id, role=Role.owner))
    target = project_dir(projects_dir, project.id)
    shutil.copytree(template_dir, target, ignore=shutil.ignore_patterns("__pycache__"))
    try:
        db.commit()
    except Exception:
        shutil.rmtree(target, ignore_errors=True)
        raise
    return project


def list_for_user(db: Session, user: User) -> list[tuple[Project, Role]]:
    """Projects the user is a member of (own and shared), newest first."""
    rows = db.execute(
        select(Project, Membership.role)
        .join(Membership, Membership.project_id == Project.id)
        .where(Membership.user_id == user.id)
        .order_by(Project.created_at.desc(), Project.id)
    ).all()
    return [(project, Role(role)) for project, role in rows]


def update(db: Session, project: Project, name: str | None, visibility: Visibility | None) -> Project:
    if name is not None:
        project.name = _clean_name(name)
    if visibility is not None:
        project.visibility = visibility
    db.commit()
    return project


def delete(db: Session, projects_dir: Path, project: Project) -> None:
    db.delete(project)
    db.commit()
    shutil.rmtree(project_dir(projects_dir, project.id), ignore_errors=True)


def fork(db: Session, projects_dir: Path, source: Project, user: User, name: str | None) -> Project:
    """A private copy owned by `user`. Symlinks are not copied (they could point anywhere)."""
    copy = Project(
        id=security.new_id(),
        name=_clean_name(name if name is not None else f"{source.name[:93]} (fork)"),
        template=source.template,
        visibility=Visibility.private,
        forked_from=source.id,
    )
    db.add(copy)
    db.flush()
    db.add(Membership(project_id=copy.id, user_id=user.id, role=Role.owner))
    target = project_dir(projects_dir, copy.id)
    shutil.copytree(project_dir(projects_dir, source.id), target, symlinks=True, ignore=_symlinks)
    try:
        db.commit()
    except Exception:
        shutil.rmtree(target, ignore_errors=True)
        raise
    return copy


def _symlinks(directory: str, names: list[str]) -> list[str]:
    return [n for n in names if Path(directory, n).is_symlink()]


def list_members(db: Session, project: Project) -> list[Membership]:
    return list(
        db.scalars(
            select(Membership).join(User).where(Membership.project_id == project.id).order_by(User.username)
        )
    )


def _membership(db: Session, project: Project, username: str) -> Membership:
    member = db.scalar(
        select(Membership)
        .join(User)
        .where(Membership.project_id == project.id, User.username == username.strip().lower())
    )
    if member is None:
        raise NotFound(f"{username!r} is not a member of this project")
    return member


def _check_not_last_owner(db: Session, member: Membership) -> None:
    if member.role != Role.owner:
        return
    owners = db.execute(
        select(func.count()).where(Membership.project_id == member.project_id, Membership.role == Role.owner)
    ).scalar_one()
    if owners <= 1:
        raise Conflict("a project needs at least one owner: make someone else owner first")


def change_role(db: Session, project: Project, username: str, role: Role) -> Membership:
    member = _membership(db, project, username)
    if role != Role.owner:
        _check_not_last_owner(db, member)
    member.role = role
    db.commit()
    return member


def remove_member(db: Session, project: Project, username: str) -> Membership:
    """Remove a member; returns the removed membership (to close the user's open sockets)."""
    member = _membership(db, project, username)
    _check_not_last_owner(db, member)
    db.delete(member)
    db.commit()
    return member


def create_invite(db: Session, project: Project, creator: User, role: Role) -> tuple[Invite, str]:
    """Returns the invite and its secret token (shown once; only the hash is stored)."""
    token = security.new_token()
    invite = Invite(
        id=security.new_id(),
        project_id=project.id,
        role=role,
        token_hash=security.token_hash(token),
        created_by=creator.id,
    )
    db.add(invite)
    db.commit()
    return invite, token


def list_invites(db: Session, project: Project) -> list[Invite]:
    return list(db.scalars(select(Invite).where(Invite.project_id == project.id).order_by(Invite.created_at)))


def revoke_invite(db: Session, project: Project, invite_id: str) -> None:
    invite = db.get(Invite, invite_id)
    if invite is None or invite.project_id != project.id:
        raise NotFound("no such invite")
    db.delete(invite)
    db.commit()


def find_invite(db: Session, token: str) -> tuple[Invite, Project]:
    invite = db.scalar(select(Invite).where(Invite.token_hash == security.token_hash(token)))
    if invite is None:
        raise NotFound("this invite link is not valid (it may have been revoked)")
    project = db.get(Project, invite.project_id)
    if project is None:  # deleted with its invites; only a race gets here
        raise NotFound("this invite link is not valid (its project was deleted)")
    return invite, project


def accept_invite(db: Session, token: str, user: User) -> tuple[Project, Role]:
    """Makes `user` a member with the invite's role; a member keeps a stronger role they already have."""
    invite, project = find_invite(db, token)
    role = Role(invite.role)
    current = role_of(db, project.id, user)
    if current is None:
        db.add(Membership(project_id=project.id, user_id=user.id, role=role))
    elif not current.at_least(role):
        membership = db.get(Membership, (project.id, user.id))
        assert membership is not None  # role_of just found it
        membership.role = role
    else:
        role = current
    db.commit()
    return project, role
