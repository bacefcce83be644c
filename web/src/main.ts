/** Entry point: each Jinja page shell names its page in <body data-page>; we render that page. */
import "./style.css";
import { renderAuth } from "./pages/auth";
import { renderDashboard } from "./pages/dashboard";
import { renderInvite } from "./pages/invite";
import { renderLanding } from "./pages/landing";
import { renderProject } from "./pages/project";

const root = document.getElementById("app");
const { page, param = "" } = document.body.dataset;

if (root) {
  if (page === "landing") renderLanding(root);
  else if (page === "login" || page === "register") renderAuth(root, page);
  else if (page === "dashboard") void renderDashboard(root);
  else if (page === "project") void renderProject(root, param);
  else if (page === "invite") void renderInvite(root, param);
  // Tutorials pages load on demand, like the workspace, so the other pages stay small.
  else if (page === "courses") void import("./pages/courses").then((m) => m.renderCourses(root));
  else if (page === "course") void import("./pages/courses").then((m) => m.renderCourse(root, param));
  else if (page === "classrooms") void import("./pages/classrooms").then((m) => m.renderClassrooms(root));
  else if (page === "classroom") void import("./pages/classrooms").then((m) => m.renderClassroom(root, param));
  else if (page === "settings") void import("./pages/settings").then((m) => m.renderSettings(root));
}
