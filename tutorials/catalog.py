"""The courses this server offers (built in, from files) and lookups that answer 404 in words."""

from ide_server.errors import NotFound
from tutorials.format import Course, Lesson, builtin_courses


def courses() -> dict[str, Course]:
    """The courses on offer, by slug."""
    return builtin_courses()


def find_course(slug: str) -> Course:
    course = courses().get(slug)
    if course is None:
        raise NotFound(f"no course named {slug!r}")
    return course


def find_lesson(course: Course, slug: str) -> Lesson:
    try:
        return course.lesson(slug)
    except KeyError:
        raise NotFound(f"course {course.slug!r} has no lesson named {slug!r}") from None


def next_lesson(course: Course, lesson: Lesson) -> Lesson | None:
    index = [item.slug for item in course.lessons].index(lesson.slug) + 1
    return course.lessons[index] if index < len(course.lessons) else None
