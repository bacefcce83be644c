"""Tutorials in a real browser: a learner in a classroom starts lesson 1 of the Python course, fails
the check, reads a hint, fixes the code in the editor, passes, and the teacher's grid shows it."""

import re

from playwright.sync_api import expect

from browser_kit import each_look, signed_in_context, wait_for_file
from tutorials.format import builtin_courses

COURSE = builtin_courses()["python-from-zero"]
LESSON = COURSE.lessons[0]
ENTRY = LESSON.entry
JOIN_CODE = re.compile(r"^[A-Z2-9]{8}$")


def test_learner_passes_lesson_one_and_the_teacher_sees_it(server_url, browser, screenshot):
    teacher = signed_in_context(browser, server_url, "teacher1", register=True, width=1400, height=900)
    learner = signed_in_context(browser, server_url, "learner1", register=True, width=1400, height=900)

    # The teacher creates a classroom from the Python course and reads out the join code.
    board = teacher.new_page()
    board.goto(f"{server_url}/classrooms")
    board.get_by_label("Classroom name").fill("Year 9")
    board.locator(f"#course-choices input[value='{COURSE.slug}']").check()
    board.get_by_role("button", name="Create").click()
    code = board.locator("#join-code")
    expect(code).to_have_text(JOIN_CODE)
    join_code = code.text_content()
    expect(board.locator(".grid-host .empty")).to_contain_text("No students yet")

    # The learner joins, opens the course and starts lesson 1.
    page = learner.new_page()
    page.goto(f"{server_url}/classrooms")
    page.get_by_label("Join code").fill(join_code.lower())
    page.get_by_role("button", name="Join").click()
    expect(page.locator("#classrooms")).to_contain_text("Year 9")
    page.goto(f"{server_url}/courses")
    page.get_by_role("link", name=COURSE.title).click()
    first = page.locator(f"li[data-lesson='{LESSON.slug}']")
    expect(first).to_contain_text("Not started")
    first.get_by_role("button", name="Start").click()
    expect(page.locator("#lesson-title")).to_have_text(LESSON.title)
    expect(page.locator("#connection")).to_have_text("Synced")
    expect(page.locator(".editor-host:not([hidden]) .cm-content")).to_contain_text(LESSON.starter_files[ENTRY].splitlines()[-1])
    project_id = page.url.rstrip("/").rsplit("/", 1)[-1]

    # The starter fails: the first failure is shown, with what was expected and what came out.
    page.locator("#lesson-check").click()
    expect(page.locator("#lesson-result")).to_have_attribute("data-status", "fail", timeout=30_000)
    expect(page.locator("#lesson-message")).not_to_be_empty()
    expect(page.locator("#lesson-status")).to_have_text("Not passing yet")
    screenshot(page, "tutorials-lesson-failed")
    # On a school laptop's screen the lesson's title, Check and the verdict are all in view, the
    # expectation in words.
    page.set_viewport_size({"width": 1366, "height": 768})
    for shown in ("#lesson-title", "#lesson-check", "#lesson-expected"):
        expect(page.locator(shown)).to_be_in_viewport(ratio=1)
    expect(page.locator("#lesson-expected")).to_contain_text("a line saying: ")
    each_look(page, screenshot, "tutorials-lesson-failed")
    page.reload()  # the last result is still there after a reload
    expect(page.locator("#lesson-result")).to_have_attribute("data-status", "fail")
    expect(page.locator("#connection")).to_have_text("Synced")

    # One hint, then the fix typed into the editor.
    page.locator("#lesson-hint").click()
    expect(page.locator("#lesson-hints li")).to_have_count(1)
    expect(page.locator("#lesson-hints")).to_contain_text(LESSON.tasks[0].hints[0].replace("`", ""))
    solution = LESSON.solution_files[ENTRY]
    page.locator(".editor-host:not([hidden]) .cm-content").click()
    page.keyboard.press("Control+A")
    page.keyboard.insert_text(solution)
    wait_for_file(learner, server_url, project_id, ENTRY, solution)

    page.locator("#lesson-check").click()
    expect(page.locator("#lesson-result")).to_have_attribute("data-status", "pass", timeout=30_000)
    expect(page.locator("#lesson-status")).to_have_text("Passed")
    expect(page.locator("#lesson-next")).to_be_visible()
    expect(page.locator("#lesson-solution")).to_be_visible()
    screenshot(page, "tutorials-lesson-passed")

    # The teacher's grid (refreshing by itself) shows the pass, and opens the project read-only.
    cell = board.locator(f"tr[data-student='learner1'] td[data-lesson='{COURSE.slug}/{LESSON.slug}']")
    expect(cell).to_have_attribute("data-status", "passed", timeout=20_000)
    screenshot(board, "tutorials-classroom-grid")
    watch = teacher.new_page()
    watch.goto(server_url + cell.locator("a").get_attribute("href"))
    expect(watch.locator("#role")).to_have_text("viewer")
    expect(watch.locator("#readonly-note")).to_contain_text("Read-only")
    expect(watch.locator("#lesson-check")).to_be_hidden()
    expect(watch.locator(".editor-host:not([hidden]) .cm-content")).to_contain_text("My name is")
    expect(watch.locator("#lesson-status")).to_have_text("Passed")
    page.locator(".editor-host:not([hidden]) .cm-content").click()  # live: the teacher sees typing
    page.keyboard.press("Control+End")
    page.keyboard.insert_text("# trying more things\n")
    expect(watch.locator(".editor-host:not([hidden]) .cm-content")).to_contain_text("# trying more things")

    # The course page shows the progress.
    page.goto(f"{server_url}/courses/{COURSE.slug}")
    expect(page.locator(f"li[data-lesson='{LESSON.slug}']")).to_have_attribute("data-status", "passed")
    expect(page.locator("#course-progress")).to_contain_text(f"1 of {len(COURSE.lessons)} lessons passed")
    # The dashboard lists the lesson's project under Lessons, apart from the learner's own projects.
    page.goto(f"{server_url}/dashboard")
    expect(page.locator(f"#lesson-projects li[data-project-id='{project_id}']")).to_contain_text("Passed")
    expect(page.locator(f"#my-projects li[data-project-id='{project_id}']")).to_have_count(0)
    teacher.close()
    learner.close()

