/** The front page for signed-out visitors: what Codeyard is, and the way in (signed-in users go to the dashboard). */
import { h } from "../dom";
import { icon, withIcon, type IconName } from "../icons";

const FEATURES: [IconName, string, string][] = [
  ["people", "Edit together, live", "Share a link and write code in the same files at once, each cursor named, as in a shared document."],
  ["console", "Run in sandboxes", "Run Python, Node and more in an isolated sandbox: type into the program, stop it, open the web app it serves."],
  ["book", "Tutorials and classrooms", "Step-by-step courses whose checks explain a mistake in plain words; teachers follow the class on one grid."],
  ["deploy", "One-click deploy", "Put a web app online at its own address, with secrets kept apart, release history and roll back."],
  ["assistant", "AI help", "Completions as you type, and an assistant that explains an error in plain words, running on the server."],
  ["history", "Checkpoints and downloads", "Name a checkpoint, compare and restore versions, download a file or the whole project."],
];

export function renderLanding(root: HTMLElement): void {
  const signIn = h("a", { class: "button secondary", href: "/login", id: "landing-sign-in" }, "Sign in");
  const signUp = h("a", { class: "button", href: "/register", id: "landing-sign-up" }, "Sign up");
  root.replaceChildren(
    h("header", { class: "topbar landing-bar" }, withIcon(h("strong", { class: "brand" }, "Codeyard"), "logo"), h("span", {}), signIn, signUp),
    h(
      "main",
      { class: "landing" },
      h("section", { class: "landing-hero" },
        h("h1", {}, "Write, run and share code together, in your browser"),
        h("p", {}, "Codeyard is a code editor you host yourself: projects live on your server, programs run in sandboxes, and a class or a team edits side by side."),
        h("div", { class: "landing-actions" }, h("a", { class: "button", href: "/register" }, "Create a free account"), h("a", { class: "button secondary", href: "/login" }, "Sign in"))),
      h("ul", { class: "landing-features" },
        ...FEATURES.map(([name, title, text]) => h("li", { class: "card" }, h("h2", {}, icon(name), title), h("p", {}, text)))),
    ),
  );
}
