/** Entry point: each Jinja page shell names its page in <body data-page>; we render that page. */
import "./style.css";
import { renderAuth } from "./pages/auth";
import { renderDashboard } from "./pages/dashboard";

const root = document.getElementById("app");
const page = document.body.dataset.page;

if (root) {
  if (page === "login" || page === "register") renderAuth(root, page);
  else if (page === "dashboard") void renderDashboard(root);
}
