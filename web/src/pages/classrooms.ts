/** Classrooms: create one from courses (teachers), join with a code (students), and the teacher's
 * grid of students by lessons, refreshed every few seconds, each cell opening the student's project. */
import { api, ApiError } from "../api";
import { h, showStatus } from "../dom";
import { topbar } from "./courses";

interface Classroom {
  id: string;
  name: string;
  teacher: string;
  courses: string[];
  is_teacher: boolean;
  join_code: string | null;
}

interface Grid {
  columns: { course_slug: string; lesson_slug: string; title: string }[];
  students: { username: string; cells: { status: string; attempts: number; hints_used: number; project_id: string | null }[] }[];
}

const CELL_TEXT: Record<string, string> = { not_started: "·", started: "…", failing: "✗", passed: "✓" };
const REFRESH_MS = 4000;

function fail(error: unknown, status: HTMLElement): void {
  if (error instanceof ApiError && error.status === 401) location.assign(`/login?next=${encodeURIComponent(location.pathname)}`);
  else showStatus(status, error instanceof ApiError ? error.message : String(error), "error");
}

export async function renderClassrooms(root: HTMLElement): Promise<void> {
  const status = h("p", { class: "status" });
  const list = h("ul", { class: "projects", id: "classrooms" });
  const name = h("input", { name: "name", required: "", maxlength: "100", placeholder: "Year 9 Tuesday", "aria-label": "Classroom name" });
  const courseBoxes = h("div", { class: "course-choices", id: "course-choices" });
  const create = h("form", { class: "card create", id: "create-classroom" }, h("h2", {}, "New classroom"), name, courseBoxes, h("button", { type: "submit" }, "Create"));
  const code = h("input", { name: "code", required: "", maxlength: "32", placeholder: "ABCD2345", "aria-label": "Join code" });
  const join = h("form", { class: "card create", id: "join-classroom" }, h("h2", {}, "Join a classroom"), code, h("button", { type: "submit" }, "Join"));
  root.replaceChildren(
    topbar(["/dashboard", "Projects"], ["/courses", "Courses"]),
    h("main", { class: "dashboard" }, h("h1", {}, "Classrooms"), status, list, join, create),
  );

  async function refresh(): Promise<void> {
    const rooms = await api<Classroom[]>("GET", "/api/tutorials/classrooms");
    list.replaceChildren(
      ...rooms.map((room) =>
        h("li", { class: "project", "data-classroom": room.id },
          h("a", { href: `/classrooms/${room.id}` }, room.name),
          h("span", { class: "badge" }, room.is_teacher ? "teacher" : `student · ${room.teacher}`))),
    );
    if (!rooms.length) list.append(h("li", { class: "empty" }, "No classrooms yet. Join one with your teacher's code, or create one."));
  }

  create.addEventListener("submit", async (event) => {
    event.preventDefault();
    const courses = [...courseBoxes.querySelectorAll<HTMLInputElement>("input:checked")].map((box) => box.value);
    try {
      const room = await api<Classroom>("POST", "/api/tutorials/classrooms", { name: name.value.trim(), courses });
      location.assign(`/classrooms/${room.id}`);
    } catch (error) {
      fail(error, status);
    }
  });
  join.addEventListener("submit", async (event) => {
    event.preventDefault();
    try {
      const room = await api<Classroom>("POST", "/api/tutorials/classrooms/join", { code: code.value });
      showStatus(status, `You joined ${room.name}. Your teacher can now follow your lessons.`);
      code.value = "";
      await refresh();
    } catch (error) {
      fail(error, status);
    }
  });
  try {
    const courses = await api<{ slug: string; title: string }[]>("GET", "/api/tutorials/courses");
    courseBoxes.replaceChildren(
      ...courses.map((course) => h("label", { class: "inline" }, h("input", { type: "checkbox", value: course.slug, name: "courses" }), course.title)),
    );
    await refresh();
  } catch (error) {
    fail(error, status);
  }
}

function removeButton(username: string, remove: (username: string) => void): HTMLElement {
  const button = h("button", { type: "button", class: "icon", title: `Remove ${username} from the classroom`, "aria-label": `Remove ${username}` }, "×");
  button.addEventListener("click", () => {
    if (confirm(`Remove ${username} from this classroom? You will no longer see their lessons.`)) remove(username);
  });
  return button;
}

function gridTable(grid: Grid, remove: (username: string) => void): HTMLElement {
  const head = h("tr", {}, h("th", {}, "Student"), ...grid.columns.map((column) => h("th", { title: `${column.course_slug}: ${column.title}` }, column.title)));
  const rows = grid.students.map((student) =>
    h("tr", { "data-student": student.username },
      h("th", {}, student.username, removeButton(student.username, remove)),
      ...student.cells.map((cell, index) => {
        const column = grid.columns[index];
        const label = `${student.username}, ${column.title}: ${cell.status.replace("_", " ")}, ${cell.attempts} checks, ${cell.hints_used} hints`;
        const mark = cell.project_id
          ? h("a", { href: `/projects/${cell.project_id}`, title: `${label} (open read-only)`, target: "_blank" }, CELL_TEXT[cell.status])
          : h("span", { title: label }, CELL_TEXT[cell.status]);
        return h("td", { class: "cell", "data-status": cell.status, "data-lesson": `${column.course_slug}/${column.lesson_slug}`, "aria-label": label }, mark);
      })),
  );
  return h("table", { class: "grid", id: "grid" }, h("thead", {}, head), h("tbody", {}, ...rows));
}

export async function renderClassroom(root: HTMLElement, classroomId: string): Promise<void> {
  const status = h("p", { class: "status" });
  const title = h("h1", {}, "Classroom");
  const info = h("div", { id: "classroom-info" });
  const gridHost = h("div", { class: "grid-host" });
  root.replaceChildren(topbar(["/classrooms", "← Classrooms"], ["/courses", "Courses"]), h("main", { class: "dashboard wide" }, title, info, status, gridHost));
  const base = `/api/tutorials/classrooms/${encodeURIComponent(classroomId)}`;
  let room: Classroom;
  try {
    room = await api<Classroom>("GET", base);
  } catch (error) {
    return fail(error, status);
  }
  title.textContent = room.name;
  const courseLinks = room.courses.map((slug) => h("a", { href: `/courses/${encodeURIComponent(slug)}` }, slug));
  if (!room.is_teacher) {
    const leave = h("button", { type: "button", class: "secondary", id: "leave-classroom" }, "Leave classroom");
    leave.addEventListener("click", async () => {
      if (!confirm(`Leave ${room.name}? Your teacher will no longer see your lessons.`)) return;
      try {
        const me = await api<{ username: string }>("GET", "/api/me");
        await api("DELETE", `${base}/students/${encodeURIComponent(me.username)}`);
        location.assign("/classrooms");
      } catch (error) {
        fail(error, status);
      }
    });
    info.replaceChildren(h("p", {}, `Teacher: ${room.teacher}. Courses: `, ...courseLinks.flatMap((link, i) => (i ? [", ", link] : [link]))), leave);
    return;
  }
  const remove = h("button", { type: "button", class: "danger", id: "delete-classroom" }, "Delete classroom");
  remove.addEventListener("click", async () => {
    if (!confirm(`Delete ${room.name}? Students keep their work; you stop seeing it.`)) return;
    try {
      await api("DELETE", base);
      location.assign("/classrooms");
    } catch (error) {
      fail(error, status);
    }
  });
  info.replaceChildren(
    h("p", {}, "Students join with this code: ", h("code", { class: "join-code", id: "join-code" }, room.join_code ?? "")),
    h("p", { class: "status-info" }, "✓ passed · ✗ not passing yet · … started · · not started. Click a mark to watch that project live (read-only)."),
    remove,
  );
  const removeStudent = async (username: string) => {
    try {
      await api("DELETE", `${base}/students/${encodeURIComponent(username)}`);
      await load();
    } catch (error) {
      fail(error, status);
    }
  };
  const load = async () => {
    try {
      const grid = await api<Grid>("GET", `${base}/grid`);
      gridHost.replaceChildren(grid.students.length ? gridTable(grid, (username) => void removeStudent(username)) : h("p", { class: "empty" }, "No students yet. Share the join code."));
    } catch (error) {
      fail(error, status);
    }
  };
  await load();
  setInterval(() => {
    if (!document.hidden) void load();
  }, REFRESH_MS);
}
