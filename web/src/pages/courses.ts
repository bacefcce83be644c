/** Courses: the list with the learner's progress, and a course page whose lessons open in the workspace. */
import { api, ApiError } from "../api";
import { h, showStatus } from "../dom";
import { renderMarkdown } from "../workspace/lesson-markdown";

interface CourseSummary {
  slug: string;
  title: string;
  language: string;
  lessons: number;
  passed: number;
}

interface LessonSummary {
  slug: string;
  title: string;
  status: "not_started" | "started" | "failing" | "passed";
  attempts: number;
  hints_used: number;
  seconds_spent: number | null;
  project_id: string | null;
}

interface Course {
  slug: string;
  title: string;
  language: string;
  description: string;
  lessons: LessonSummary[];
}

export const STATUS_TEXT = { not_started: "Not started", started: "Started", failing: "Not passing yet", passed: "Passed ✓" };

export function topbar(...links: [string, string][]): HTMLElement {
  return h("header", { class: "topbar" }, h("strong", {}, "Codeyard"), ...links.map(([href, text]) => h("a", { href }, text)), h("span", {}));
}

function onAuthError(error: unknown, status: HTMLElement): void {
  if (error instanceof ApiError && error.status === 401) location.assign(`/login?next=${encodeURIComponent(location.pathname)}`);
  else showStatus(status, error instanceof ApiError ? error.message : String(error), "error");
}

function progressBar(done: number, total: number): HTMLElement {
  return h("progress", { max: String(total), value: String(done), "aria-label": `${done} of ${total} lessons passed` });
}

export async function renderCourses(root: HTMLElement): Promise<void> {
  const status = h("p", { class: "status" });
  const list = h("ul", { class: "projects", id: "courses" });
  root.replaceChildren(
    topbar(["/dashboard", "Projects"], ["/classrooms", "Classrooms"]),
    h("main", { class: "dashboard" }, h("h1", {}, "Courses"), status, list),
  );
  try {
    const courses = await api<CourseSummary[]>("GET", "/api/tutorials/courses");
    list.replaceChildren(
      ...courses.map((course) =>
        h("li", { class: "project course", "data-course": course.slug },
          h("a", { href: `/courses/${encodeURIComponent(course.slug)}` }, course.title),
          h("span", { class: "badge" }, course.language),
          progressBar(course.passed, course.lessons),
          h("small", {}, `${course.passed} / ${course.lessons} passed`)),
      ),
    );
  } catch (error) {
    onAuthError(error, status);
  }
}

function minutes(seconds: number | null): string {
  if (seconds === null) return "";
  return seconds < 60 ? "under a minute" : `${Math.round(seconds / 60)} min`;
}

export async function renderCourse(root: HTMLElement, slug: string): Promise<void> {
  const status = h("p", { class: "status" });
  const title = h("h1", {}, "Course");
  const list = h("ol", { class: "projects lessons", id: "lessons" });
  root.replaceChildren(topbar(["/courses", "← Courses"], ["/classrooms", "Classrooms"]), h("main", { class: "dashboard" }, title, status, list));
  let course: Course;
  try {
    course = await api<Course>("GET", `/api/tutorials/courses/${encodeURIComponent(slug)}`);
  } catch (error) {
    return onAuthError(error, status);
  }
  const passed = course.lessons.filter((lesson) => lesson.status === "passed").length;
  title.textContent = course.title;
  title.after(renderMarkdown(course.description), h("p", { id: "course-progress" }, progressBar(passed, course.lessons.length), ` ${passed} of ${course.lessons.length} lessons passed`));
  list.replaceChildren(
    ...course.lessons.map((lesson, index) => {
      const open = h("button", { type: "button", class: lesson.project_id ? "secondary" : "" }, lesson.project_id ? "Continue" : "Start");
      open.addEventListener("click", async () => {
        open.disabled = true;
        try {
          const started = await api<{ url: string }>("POST", `/api/tutorials/courses/${encodeURIComponent(course.slug)}/lessons/${encodeURIComponent(lesson.slug)}/start`);
          location.assign(started.url);
        } catch (error) {
          open.disabled = false;
          onAuthError(error, status);
        }
      });
      const facts = lesson.status === "not_started" ? "" : `${lesson.attempts} checks · ${lesson.hints_used} hints · ${minutes(lesson.seconds_spent)}`;
      return h("li", { class: "project lesson", "data-lesson": lesson.slug, "data-status": lesson.status },
        h("strong", { class: "lesson-name" }, `${index + 1}. ${lesson.title}`),
        h("span", { class: "badge lesson-state" }, STATUS_TEXT[lesson.status]),
        h("small", {}, facts),
        open);
    }),
  );
}
