/** Dashboard: my projects, my lessons' projects (apart, so they do not clutter the list), projects shared with me,
 * create from a template, fork, delete. */
import { api, ApiError } from "../api";
import type { LessonProjectPublic as LessonProject, ProjectPublic as Project, TemplatePublic as Template, UserPublic as Me } from "../api/types";
import { h, showStatus } from "../dom";
import { withIcon } from "../icons";
import { STATUS_TEXT } from "./courses";

function projectRow(project: Project, refresh: () => void, status: HTMLElement, lesson?: LessonProject): HTMLElement {
  const fork = h("button", { type: "button", class: "secondary" }, "Fork");
  fork.addEventListener("click", async () => {
    showStatus(status, `Forking ${project.name}…`);
    try {
      await api("POST", `/api/projects/${project.id}/fork`, { name: `${project.name}-fork` });
      showStatus(status, `Forked ${project.name}.`);
      refresh();
    } catch (error) {
      showStatus(status, (error as ApiError).message, "error");
    }
  });
  const actions = h("span", { class: "actions" }, fork);
  if (project.role === "owner") {
    const remove = h("button", { type: "button", class: "danger" }, "Delete");
    remove.addEventListener("click", async () => {
      if (!confirm(`Delete ${project.name} and all its files? This cannot be undone.`)) return;
      try {
        await api("DELETE", `/api/projects/${project.id}`);
        showStatus(status, `Deleted ${project.name}.`);
        refresh();
      } catch (error) {
        showStatus(status, (error as ApiError).message, "error");
      }
    });
    actions.append(remove);
  }
  return h(
    "li",
    { class: "project", "data-project-id": project.id },
    h("a", { href: `/projects/${project.id}` }, project.name),
    h("span", { class: "badge" }, project.visibility),
    lesson ? h("span", { class: "badge" }, STATUS_TEXT[lesson.status]) : h("span", { class: "badge" }, project.role ?? ""),
    actions,
  );
}

export async function renderDashboard(root: HTMLElement): Promise<void> {
  const status = h("p", { class: "status" });
  const mine = h("ul", { class: "projects", id: "my-projects" });
  const shared = h("ul", { class: "projects", id: "shared-projects" });
  const lessons = h("ul", { class: "projects", id: "lesson-projects" });
  const lessonsHeading = h("h2", { hidden: "" }, "Lessons");
  const name = h("input", { name: "name", required: "", placeholder: "my-project", maxlength: "100" });
  const template = h("select", { name: "template", "aria-label": "Template" });
  const create = h("form", { class: "card create" }, h("h2", {}, "New project"), name, template, withIcon(h("button", { type: "submit" }, "Create"), "plus"));
  const logout = withIcon(h("button", { type: "button", class: "secondary" }, "Sign out"), "signOut");
  const greeting = h("span", {});
  root.replaceChildren(
    h("header", { class: "topbar" }, h("strong", {}, "Codeyard"), h("a", { href: "/courses" }, "Courses"),
      h("a", { href: "/classrooms" }, "Classrooms"), withIcon(h("a", { href: "/settings", id: "settings-link" }, "Settings"), "settings"), greeting, logout),
    h("main", { class: "dashboard" }, create, status, h("h2", {}, "My projects"), mine, lessonsHeading, lessons,
      h("h2", {}, "Shared with me"), shared),
  );

  async function refresh(): Promise<void> {
    try {
      const [projects, lessonProjects] = await Promise.all([
        api<Project[]>("GET", "/api/projects"),
        api<LessonProject[]>("GET", "/api/tutorials/lesson-projects"),
      ]);
      const lessonOf = new Map(lessonProjects.map((lesson) => [lesson.project_id, lesson]));
      const own = projects.filter((p) => p.role === "owner");
      mine.replaceChildren(...own.filter((p) => !lessonOf.has(p.id)).map((p) => projectRow(p, refresh, status)));
      lessons.replaceChildren(...own.filter((p) => lessonOf.has(p.id)).map((p) => projectRow(p, refresh, status, lessonOf.get(p.id))));
      lessonsHeading.hidden = lessons.childElementCount === 0;
      shared.replaceChildren(...projects.filter((p) => p.role !== "owner").map((p) => projectRow(p, refresh, status)));
      if (mine.childElementCount === 0) mine.append(h("li", { class: "empty" }, "No projects yet. Create one above."));
    } catch (error) {
      if (error instanceof ApiError && error.status === 401) location.assign("/login?next=/dashboard");
      else showStatus(status, (error as Error).message, "error");
    }
  }

  create.addEventListener("submit", async (event) => {
    event.preventDefault();
    showStatus(status, "Creating project…");
    try {
      await api("POST", "/api/projects", { name: name.value.trim(), template: template.value });
      name.value = "";
      showStatus(status, "Project created.");
      await refresh();
    } catch (error) {
      showStatus(status, (error as ApiError).message, "error");
    }
  });
  logout.addEventListener("click", async () => {
    await api("POST", "/api/auth/logout").catch(() => undefined);
    location.assign("/login");
  });

  try {
    const me = await api<Me>("GET", "/api/me");
    greeting.textContent = `Signed in as ${me.username}`;
  } catch (error) {
    if (error instanceof ApiError && error.status === 401) return location.assign("/login?next=/dashboard");
  }
  const templates = await api<Template[]>("GET", "/api/templates").catch(() => []);
  template.replaceChildren(...templates.map((t) => h("option", { value: t.id }, t.title)));
  await refresh();
}
