/** Entry point: each Jinja page shell names its page in <body data-page>; we render that page. */
import "./style.css";
import { renderAuth } from "./pages/auth";
import { renderDashboard } from "./pages/dashboard";
import { renderInvite } from "./pages/invite";
import { renderProject } from "./pages/project";

const root = document.getElementById("app");
const { page, param = "" } = document.body.dataset;

if (root) {
  if (page === "login" || page === "register") renderAuth(root, page);
  else if (page === "dashboard") void renderDashboard(root);
  else if (page === "project") void renderProject(root, param);
  else if (page === "invite") void renderInvite(root, param);
}
