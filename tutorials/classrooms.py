"""Classrooms: a teacher picks courses, students join with a code, the teacher watches a grid.

The teacher follows a student's lesson project as a project viewer (read-only, live through
collab), granted when the student starts a lesson of the classroom's courses or joins later.
Classrooms you neither teach nor joined answer 404, so ids reveal nothing.
"""

import secrets
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from ide_server import security
from ide_server.errors import Conflict, InvalidInput, NotFound, PermissionDenied
from ide_server.models import Membership, Role, User
from tutorials import catalog
from tutorials.format import Course, Lesson
from tutorials.models import Classroom, ClassroomCourse, ClassroomStudent, LessonProgress

# No look-alikes (0/O, 1/I/L): codes are read aloud and typed from a whiteboard.
CODE_ALPHABET = "ABCDEFGHJKMNPQRSTUVWXYZ23456789"
CODE_LENGTH = 8


def new_join_code() -> str:
    return "".join(secrets.choice(CODE_ALPHABET) for _ in range(CODE_LENGTH))


def normalise_code(code: str) -> str:
    return "".join(code.split()).replace("-", "").upper()


def create(db: Session, teacher: User, name: str, course_slugs: list[str]) -> Classroom:
    name = name.strip()
    if not name:
        raise InvalidInput("name: give the classroom a name")
    if not course_slugs:
        raise InvalidInput("courses: pick at least one course")
    if len(set(course_slugs)) != len(course_slugs):
        raise InvalidInput("courses: a course is listed twice")
    for slug in course_slugs:
        catalog.find_course(slug)
    classroom = Classroom(id=security.new_id(), name=name, teacher_id=teacher.id, join_code=new_join_code())
    db.add(classroom)
    db.flush()
    db.add_all(ClassroomCourse(classroom_id=classroom.id, course_slug=slug, position=i) for i, slug in enumerate(course_slugs))
    db.commit()
    return classroom


def course_slugs(db: Session, classroom: Classroom) -> list[str]:
    return list(
        db.scalars(
            select(ClassroomCourse.course_slug)
            .where(ClassroomCourse.classroom_id == classroom.id)
            .order_by(ClassroomCourse.position)
        )
    )


def courses_of(db: Session, classroom: Classroom) -> list[Course]:
    """The classroom's courses this server still offers, in the teacher's order."""
    offered = catalog.courses()
    return [offered[slug] for slug in course_slugs(db, classroom) if slug in offered]


def is_student(db: Session, classroom: Classroom, user: User) -> bool:
    return db.get(ClassroomStudent, (classroom.id, user.id)) is not None


def join(db: Session, user: User, code: str) -> Classroom:
    """Join by code; the teacher can then watch the lesson projects the student already has."""
    classroom = db.scalar(select(Classroom).where(Classroom.join_code == normalise_code(code)))
    if classroom is None:
        raise NotFound("no classroom has this join code; check it with your teacher")
    if classroom.teacher_id == user.id:
        raise Conflict("you teach this classroom, so you can't join it as a student")
    if not is_student(db, classroom, user):
        db.add(ClassroomStudent(classroom_id=classroom.id, user_id=user.id))
        slugs = course_slugs(db, classroom)
        projects = db.scalars(
            select(LessonProgress.project_id).where(
                LessonProgress.user_id == user.id,
                LessonProgress.course_slug.in_(slugs),
                LessonProgress.project_id.is_not(None),
            )
        )
        for project_id in projects:
            if project_id is not None:  # (the query leaves none out; the column may be NULL)
                _grant_viewer(db, project_id, classroom.teacher_id)
        db.commit()
    return classroom


def share_with_teachers(db: Session, student: User, course_slug: str, project_id: str) -> None:
    """Make the teachers of the student's classrooms with this course viewers of the project
    (the caller commits)."""
    teacher_ids = db.scalars(
        select(Classroom.teacher_id)
        .join(ClassroomStudent, ClassroomStudent.classroom_id == Classroom.id)
        .join(ClassroomCourse, ClassroomCourse.classroom_id == Classroom.id)
        .where(ClassroomStudent.user_id == student.id, ClassroomCourse.course_slug == course_slug)
        .distinct()
    )
    for teacher_id in teacher_ids:
        _grant_viewer(db, project_id, teacher_id)


def _grant_viewer(db: Session, project_id: str, user_id: int) -> None:
    """Viewer role, unless the user already has a role on the project."""
    if db.get(Membership, (project_id, user_id)) is None:
        db.add(Membership(project_id=project_id, user_id=user_id, role=Role.viewer))
        db.flush()


def _revoke_teacher(db: Session, classroom: Classroom, student_id: int) -> list[str]:
    """Take back the viewer role this classroom gave its teacher on the student's lesson projects,
    except where another of the teacher's classrooms with this student still covers the course.
    A stronger role the student gave the teacher themselves stays. Returns the projects changed."""
    still_covered = select(ClassroomCourse.course_slug).join(
        ClassroomStudent, ClassroomStudent.classroom_id == ClassroomCourse.classroom_id
    ).join(Classroom, Classroom.id == ClassroomCourse.classroom_id).where(
        Classroom.teacher_id == classroom.teacher_id,
        Classroom.id != classroom.id,
        ClassroomStudent.user_id == student_id,
    )
    courses = set(course_slugs(db, classroom)) - set(db.scalars(still_covered))
    project_ids = db.scalars(
        select(LessonProgress.project_id).where(
            LessonProgress.user_id == student_id,
            LessonProgress.course_slug.in_(courses),
            LessonProgress.project_id.is_not(None),
        )
    )
    revoked: list[str] = []
    for project_id in project_ids:
        if project_id is None:  # (the query leaves none out; the column may be NULL)
            continue
        member = db.get(Membership, (project_id, classroom.teacher_id))
        if member is not None and member.role == Role.viewer:
            db.delete(member)
            revoked.append(project_id)
    return revoked


def remove_student(db: Session, classroom: Classroom, username: str, by: User) -> list[str]:
    """The teacher removes a student, or a student leaves (`by` is a member: see get_for_member);
    the teacher stops seeing their lessons. Returns the projects the teacher lost access to."""
    student = db.scalar(select(User).where(User.username == username.strip().lower()))
    if by.id != classroom.teacher_id and (student is None or student.id != by.id):
        raise PermissionDenied("only the teacher can remove other students")
    if student is None or (row := db.get(ClassroomStudent, (classroom.id, student.id))) is None:
        raise NotFound(f"{username!r} is not a student of this classroom")
    revoked = _revoke_teacher(db, classroom, student.id)
    db.delete(row)
    db.commit()
    return revoked


def delete(db: Session, classroom: Classroom) -> list[str]:
    """Delete a classroom; the teacher stops seeing its students' lessons (returns those projects)."""
    student_ids = db.scalars(select(ClassroomStudent.user_id).where(ClassroomStudent.classroom_id == classroom.id))
    revoked = [project_id for student_id in list(student_ids) for project_id in _revoke_teacher(db, classroom, student_id)]
    db.delete(classroom)
    db.commit()
    return revoked


def list_for_user(db: Session, user: User) -> list[Classroom]:
    """Classrooms the user teaches or has joined, newest first."""
    joined = select(ClassroomStudent.classroom_id).where(ClassroomStudent.user_id == user.id)
    return list(
        db.scalars(
            select(Classroom)
            .where((Classroom.teacher_id == user.id) | Classroom.id.in_(joined))
            .order_by(Classroom.created_at.desc(), Classroom.id)
        )
    )


def get_for_member(db: Session, classroom_id: str, user: User) -> Classroom:
    """The classroom if the user teaches it or joined it; otherwise NotFound."""
    classroom = db.get(Classroom, classroom_id)
    if classroom is None or (classroom.teacher_id != user.id and not is_student(db, classroom, user)):
        raise NotFound("no such classroom")
    return classroom


def get_for_teacher(db: Session, classroom_id: str, user: User) -> Classroom:
    """The classroom if the user teaches it; students and strangers get NotFound."""
    classroom = db.get(Classroom, classroom_id)
    if classroom is None or classroom.teacher_id != user.id:
        raise NotFound("no such classroom")
    return classroom


def teacher_name(db: Session, classroom: Classroom) -> str:
    teacher = db.get(User, classroom.teacher_id)
    assert teacher is not None  # a teacher's classrooms are deleted with them (cascade)
    return teacher.username


@dataclass(frozen=True)
class GridRow:
    """One student's line of the grid: progress per (course slug, lesson slug)."""

    student: User
    cells: dict[tuple[str, str], LessonProgress]


def grid(db: Session, classroom: Classroom) -> tuple[list[tuple[Course, Lesson]], list[GridRow]]:
    """Columns (every lesson of the classroom's courses) and one row per student, by username."""
    courses = courses_of(db, classroom)
    columns = [(course, lesson) for course in courses for lesson in course.lessons]
    students = list(
        db.scalars(
            select(User)
            .join(ClassroomStudent, ClassroomStudent.user_id == User.id)
            .where(ClassroomStudent.classroom_id == classroom.id)
            .order_by(User.username)
        )
    )
    slugs = [course.slug for course in courses]
    cells: dict[int, dict[tuple[str, str], LessonProgress]] = {student.id: {} for student in students}
    if students:
        rows = db.scalars(
            select(LessonProgress).where(
                LessonProgress.user_id.in_(list(cells)), LessonProgress.course_slug.in_(slugs)
            )
        )
        for row in rows:
            cells[row.user_id][(row.course_slug, row.lesson_slug)] = row
    return columns, [GridRow(student, cells[student.id]) for student in students]
