"""DeployRules on its own (SQLite and PostgreSQL, nothing started): the queue of releases per project,
which releases can be rolled back to, what pruning frees, what comes back after a restart."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest
from sqlalchemy.orm import Session, sessionmaker

from deploy_service.detect import MAX_INSTANCES
from deploy_service.models import Release
from deploy_service.rules import MAX_PENDING_RELEASES, ROLLBACK_RELEASES, DeploymentNotFound, DeployRules, NewRelease
from ide_server.db import make_engine, make_sessionmaker, migrate
from ide_server.errors import Conflict, InvalidInput
from ide_server.models import Project, User


@pytest.fixture(scope="module")
def sessions(database_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(database_url)
    migrate(engine)
    yield make_sessionmaker(engine)
    engine.dispose()


@pytest.fixture
def rules(sessions: sessionmaker[Session]) -> DeployRules:
    return DeployRules(sessions)


@pytest.fixture
def owner_and_project(sessions: sessionmaker[Session]) -> tuple[User, str]:
    with sessions() as db, db.begin():
        user = User(username=f"u{secrets.token_hex(4)}", password_hash="-")
        db.add(user)
        db.flush()
        project = Project(id=secrets.token_hex(8), name="My App!", template="python")
        db.add(project)
    return user, project.id


def live(rules: DeployRules, user: User, project_id: str) -> NewRelease:
    """A release that went live (as the pipeline records it)."""
    new = rules.open_release(user, project_id)
    assert rules.went_live(new.deployment_id, new.release_id, 1) == new.number
    return new


def test_a_project_queues_a_bounded_number_of_releases(rules: DeployRules, owner_and_project: tuple[User, str]) -> None:
    user, project_id = owner_and_project
    with pytest.raises(DeploymentNotFound):
        rules.deployment_id(project_id)
    opened = [rules.open_release(user, project_id) for _ in range(MAX_PENDING_RELEASES)]
    assert [n.number for n in opened] == list(range(1, MAX_PENDING_RELEASES + 1))
    assert {n.deployment_id for n in opened} == {rules.deployment_id(project_id)}
    deployment, releases = rules.releases(project_id)
    assert deployment.slug.startswith("my-app-") and deployment.status == "deploying"
    assert [r.status for r in releases] == ["building"] * MAX_PENDING_RELEASES
    with pytest.raises(Conflict, match="already under way"):
        rules.open_release(user, project_id)
    rules.failed(opened[0].deployment_id, opened[0].release_id, "the build failed\nlog...", was_live=False)
    deployment, releases = rules.releases(project_id)
    assert deployment.status == "failed"  # nothing ever went live
    failed = next(r for r in releases if r.id == opened[0].release_id)
    assert failed.status == "failed" and failed.message == "the build failed\nlog..."
    assert rules.open_release(user, project_id).number == MAX_PENDING_RELEASES + 1  # a finished one frees its place
    assert rules.releases(project_id)[0].status == "deploying"


def test_rollback_targets_are_the_recent_releases_that_went_live(
        rules: DeployRules, owner_and_project: tuple[User, str]) -> None:
    user, project_id = owner_and_project
    went_live = [live(rules, user, project_id) for _ in range(ROLLBACK_RELEASES + 2)]
    current = went_live[-1]
    failed = rules.open_release(user, project_id)
    rules.failed(failed.deployment_id, failed.release_id, "unhealthy", was_live=False)
    for release in went_live[1:-1]:  # the last ROLLBACK_RELEASES before the current one
        assert rules.rollback_target(project_id, release.release_id).number == release.number
    for release, why in [(went_live[0], "cannot be rolled back to"), (current, "cannot be rolled back to"),
                         (failed, "cannot be rolled back to")]:
        with pytest.raises(InvalidInput, match=why):
            rules.rollback_target(project_id, release.release_id)
    with pytest.raises(InvalidInput, match="no release"):
        rules.rollback_target(project_id, "0" * 16)
    deployment, releases = rules.releases(project_id)
    assert deployment.current_release_id == current.release_id and deployment.status == "running"
    assert [r.status for r in releases if r.id in {n.release_id for n in went_live}].count("live") == 1
    assert {r.id for r in releases if r.can_roll_back} == {n.release_id for n in went_live[1:-1]}
    # only folders nobody can roll back to go: the oldest live one and the failed one
    assert set(rules.prune(current.deployment_id)) == {went_live[0].release_id, failed.release_id}


def test_instances_are_bounded(rules: DeployRules) -> None:
    rules.check_instances(1)
    rules.check_instances(MAX_INSTANCES)
    for wrong in (0, MAX_INSTANCES + 1):
        with pytest.raises(InvalidInput, match=f"from 1 to {MAX_INSTANCES}"):
            rules.check_instances(wrong)


def test_after_a_restart_releases_under_way_fail_and_serving_apps_come_back(
        rules: DeployRules, owner_and_project: tuple[User, str], sessions: sessionmaker[Session]) -> None:
    user, project_id = owner_and_project
    serving = live(rules, user, project_id)
    building = rules.open_release(user, project_id)
    restorable = rules.restorable()
    assert (serving.deployment_id, serving.release_id) in restorable.wanted
    with sessions() as db:
        interrupted = db.get(Release, building.release_id)
        assert interrupted is not None and interrupted.status == "failed"
        assert interrupted.message == "the server stopped while this release was being deployed"
    rules.set_status(serving.deployment_id, "stopped")
    restorable = rules.restorable()
    assert serving.deployment_id not in {d for d, _ in restorable.wanted}
    assert rules.deployment_by_id(serving.deployment_id).slug in restorable.stopped_slugs


def test_a_release_going_live_during_a_read_is_never_shown_half_done(
        rules: DeployRules, owner_and_project: tuple[User, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Each SELECT sees the latest commit: a release going live between the read of the deployment and the
    read of its releases showed it live under a deployment still "deploying" (seen in CI)."""
    user, project_id = owner_and_project
    new = rules.open_release(user, project_id)
    rollback_ids, commits = rules._rollback_ids, []

    def going_live_meanwhile(db: Session, deployment: object) -> set[str]:
        if not commits:  # once, after the releases were read
            commits.append(rules.went_live(new.deployment_id, new.release_id, 1))
        return rollback_ids(db, deployment)

    monkeypatch.setattr(rules, "_rollback_ids", going_live_meanwhile)
    deployment, releases = rules.releases(project_id)
    assert commits == [1]
    assert (deployment.status, deployment.current_release_id) == ("running", new.release_id)
    assert [r.status for r in releases] == ["live"]
