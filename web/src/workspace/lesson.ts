/** The lesson pane of a lesson project: description, tasks, Check with the first failure in plain
 * words (expected vs what the code gave), hints one at a time, the solution when allowed, Next. */
import { api, ApiError } from "../api";
import { h, showStatus } from "../dom";
import { renderMarkdown } from "./lesson-markdown";

type Status = "not_started" | "started" | "failing" | "passed";

interface Lesson {
  course_slug: string;
  course_title: string;
  lesson_slug: string;
  title: string;
  description: string;
  tasks: { number: number; text: string; hints_available: number }[];
  visible_tests: { files: Record<string, string>; io_checks: IOCheck[] };
  hints: { task: number; text: string }[];
  hints_total: number;
  attempts: number;
  status: Status;
  last_result: Grade | null;
  solution_available: boolean;
  solution_after_attempts: number;
  next_lesson: string | null;
}

interface IOCheck {
  name: string;
  task: number | null;
  stdin: string;
  stdout: string | null;
  stdout_regex: string | null;
}

interface TestResult {
  name: string;
  status: "pass" | "fail" | "error";
  task_id: number | null;
  hidden: boolean;
}

interface FirstFailure {
  test: string;
  task_id: number | null;
  message: string;
  expected: string | null;
  actual: string | null;
  explanation: string;
  file: string | null;
  line: number | null;
}

interface Grade {
  status: "pass" | "fail" | "error";
  message: string;
  tests: TestResult[];
  first_failure: FirstFailure | null;
}

/** The visible tests, folded away: learners may read exactly what is checked (hidden tests never come). */
function visibleTests(tests: Lesson["visible_tests"]): HTMLElement | string {
  const count = Object.keys(tests.files).length + tests.io_checks.length;
  if (!count) return "";
  const checks = tests.io_checks.map((check) =>
    h("li", {}, h("strong", {}, check.name), check.task ? ` (task ${check.task})` : "",
      check.stdin ? h("div", {}, "Input: ", h("pre", {}, check.stdin)) : "",
      check.stdout !== null ? h("div", {}, "Prints exactly: ", h("pre", {}, check.stdout))
        : h("div", {}, "Output matches the pattern: ", h("pre", {}, check.stdout_regex ?? ""))));
  const files = Object.entries(tests.files).flatMap(([name, text]) => [h("p", {}, h("code", {}, name)), h("pre", {}, text)]);
  return h("details", { class: "lesson-tests", id: "lesson-tests" },
    h("summary", {}, `What Check tests (${count} visible)`),
    checks.length ? h("ul", {}, ...checks) : "", ...files);
}

const STATUS_TEXT: Record<Status, string> = {
  not_started: "Not started",
  started: "Started",
  failing: "Not passing yet",
  passed: "Passed",
};

export class LessonPane {
  readonly element = h("section", { class: "lesson-pane", id: "lesson", "aria-label": "Lesson" });
  private readonly checkButton = h("button", { type: "button", id: "lesson-check" }, "✔ Check");
  private readonly hintButton = h("button", { type: "button", class: "secondary", id: "lesson-hint" }, "Show a hint");
  private readonly solutionButton = h("button", { type: "button", class: "secondary", id: "lesson-solution" }, "Show the solution");
  private readonly nextButton = h("button", { type: "button", id: "lesson-next" }, "Next lesson →");
  private readonly result = h("div", { class: "lesson-result", id: "lesson-result", "aria-live": "polite" });
  private readonly hints = h("ol", { class: "lesson-hints", id: "lesson-hints" });
  private readonly solution = h("div", { class: "lesson-solution", id: "lesson-solution-files" });
  private readonly badge = h("span", { class: "badge", id: "lesson-status" });
  private readonly attempts = h("small", { id: "lesson-attempts" });
  private readonly status = h("p", { class: "status" });
  private readonly base: string;

  constructor(private readonly lesson: Lesson, projectId: string, canWrite: boolean) {
    this.base = `/api/projects/${encodeURIComponent(projectId)}/lesson`;
    this.checkButton.addEventListener("click", () => void this.check());
    this.hintButton.addEventListener("click", () => void this.hint());
    this.solutionButton.addEventListener("click", () => void this.showSolution());
    this.nextButton.addEventListener("click", () => void this.next());
    const courseLink = h("a", { href: `/courses/${encodeURIComponent(lesson.course_slug)}` }, lesson.course_title);
    const tasks = h("ol", { class: "lesson-tasks", id: "lesson-tasks" }, ...lesson.tasks.map((task) => h("li", {}, renderMarkdown(task.text))));
    this.checkButton.hidden = this.hintButton.hidden = !canWrite;
    // The title stays on top and Check with its result at the bottom; the text between scrolls, so on a laptop
    // screen a learner sees what they are doing and the verdict together.
    this.element.append(
      h("div", { class: "lesson-head" }, h("p", { class: "lesson-crumbs" }, courseLink, " › ", this.badge), h("h2", { id: "lesson-title" }, lesson.title)),
      h(
        "div",
        { class: "lesson-body" },
        renderMarkdown(lesson.description),
        h("h3", {}, "Tasks"),
        tasks,
        visibleTests(lesson.visible_tests),
        this.hints,
        h("div", { class: "lesson-actions" }, this.hintButton, this.solutionButton),
        this.solution,
        this.status,
      ),
      h("div", { class: "lesson-foot" }, h("div", { class: "lesson-actions" }, this.checkButton, this.nextButton, this.attempts), this.result),
    );
    this.update(lesson);
    if (lesson.last_result) this.showResult(lesson.last_result);
  }

  private update(lesson: Lesson): void {
    Object.assign(this.lesson, lesson);
    this.badge.textContent = STATUS_TEXT[lesson.status];
    this.badge.dataset.status = lesson.status;
    this.attempts.textContent = lesson.attempts ? `${lesson.attempts} check${lesson.attempts === 1 ? "" : "s"} so far` : "";
    this.hints.replaceChildren(
      ...lesson.hints.map((hint, index) => h("li", { class: "lesson-hint" }, h("strong", {}, `Hint ${index + 1} (task ${hint.task}): `), renderMarkdown(hint.text))),
    );
    const left = lesson.hints_total - lesson.hints.length;
    this.hintButton.textContent = left ? `Show a hint (${left} left)` : "No more hints";
    this.hintButton.disabled = left === 0;
    this.solutionButton.hidden = !lesson.solution_available;
    this.nextButton.hidden = lesson.status !== "passed" || lesson.next_lesson === null;
  }

  private say(text: string, kind: "error" | "info" = "info"): void {
    showStatus(this.status, text, kind);
  }

  private async check(): Promise<void> {
    this.checkButton.disabled = true;
    this.result.replaceChildren(h("p", { class: "status status-info" }, "Checking your code…"));
    try {
      const answer = await api<{ result: Grade; lesson: Lesson }>("POST", `${this.base}/check`);
      this.showResult(answer.result);
      this.update(answer.lesson);
    } catch (error) {
      this.result.replaceChildren();
      this.say(error instanceof ApiError ? error.message : String(error), "error");
    } finally {
      this.checkButton.disabled = false;
    }
  }

  private showResult(grade: Grade): void {
    this.result.dataset.status = grade.status;
    if (grade.status === "pass") {
      const done = this.lesson.next_lesson ? "Well done! Go on to the next lesson when you're ready." : "Well done! You finished the last lesson of this course.";
      this.result.replaceChildren(h("p", { class: "lesson-pass" }, `All ${grade.tests.length} checks passed. ${done}`));
      return;
    }
    const failure = grade.first_failure;
    const parts: HTMLElement[] = [];
    const passed = grade.tests.filter((test) => test.status === "pass").length;
    if (grade.tests.length) parts.push(h("p", { class: "lesson-score" }, `${passed} of ${grade.tests.length} checks passed.`));
    if (failure) {
      const where = failure.file && failure.line ? ` (${failure.file}, line ${failure.line})` : "";
      const task = failure.task_id ? `Task ${failure.task_id}: ` : "";
      const heading = failure.test ? `${task}“${failure.test}” did not pass${where}` : `Your code could not be checked${where}`;
      parts.push(h("p", { class: "lesson-fail" }, heading));
      parts.push(h("pre", { class: "lesson-message", id: "lesson-message" }, failure.message || grade.message));
      if (failure.expected !== null && failure.actual !== null) {
        parts.push(
          h("div", { class: "lesson-compare" },
            h("div", {}, h("strong", {}, "We expected"), h("pre", { id: "lesson-expected" }, failure.expected)),
            h("div", {}, h("strong", {}, "Your code gave"), h("pre", { id: "lesson-actual" }, failure.actual))),
        );
      }
    } else {
      parts.push(h("pre", { class: "lesson-message", id: "lesson-message" }, grade.message));
    }
    this.result.replaceChildren(...parts);
  }

  private async hint(): Promise<void> {
    try {
      this.update(await api<Lesson>("POST", `${this.base}/hints`));
    } catch (error) {
      this.say(error instanceof ApiError ? error.message : String(error), "error");
    }
  }

  private async showSolution(): Promise<void> {
    try {
      const { files } = await api<{ files: Record<string, string> }>("GET", `${this.base}/solution`);
      this.solution.replaceChildren(
        h("h3", {}, "Solution"),
        ...Object.entries(files).flatMap(([name, text]) => [h("p", {}, h("code", {}, name)), h("pre", {}, text)]),
      );
    } catch (error) {
      this.say(error instanceof ApiError ? error.message : String(error), "error");
    }
  }

  private async next(): Promise<void> {
    if (!this.lesson.next_lesson) return;
    this.nextButton.disabled = true;
    try {
      const started = await api<{ url: string }>(
        "POST",
        `/api/tutorials/courses/${encodeURIComponent(this.lesson.course_slug)}/lessons/${encodeURIComponent(this.lesson.next_lesson)}/start`,
      );
      location.assign(started.url);
    } catch (error) {
      this.nextButton.disabled = false;
      this.say(error instanceof ApiError ? error.message : String(error), "error");
    }
  }
}

/** Adds the lesson pane to a workspace when its project is a lesson (other projects: nothing). Members only. */
export async function attachLesson(workspace: HTMLElement, projectId: string, canWrite: boolean): Promise<LessonPane | null> {
  let lesson: Lesson | null;
  try {
    lesson = await api<Lesson | null>("GET", `/api/projects/${encodeURIComponent(projectId)}/lesson`);
  } catch {
    return null; // the server could not answer: the workspace works without the lesson pane
  }
  if (lesson === null) return null; // not a lesson
  const pane = new LessonPane(lesson, projectId, canWrite);
  workspace.classList.add("with-lesson");
  workspace.prepend(pane.element);
  return pane;
}
