/** Sign-in and registration pages: one form, two endpoints. */
import { api, ApiError } from "../api";
import { h, showStatus } from "../dom";

type Mode = "login" | "register";

const COPY: Record<Mode, { title: string; button: string; endpoint: string; switchText: string; switchHref: string }> = {
  login: {
    title: "Sign in to Codeyard",
    button: "Sign in",
    endpoint: "/api/auth/login",
    switchText: "New here? Create an account",
    switchHref: "/register",
  },
  register: {
    title: "Create your Codeyard account",
    button: "Create account",
    endpoint: "/api/auth/register",
    switchText: "Already have an account? Sign in",
    switchHref: "/login",
  },
};

export function renderAuth(root: HTMLElement, mode: Mode): void {
  const copy = COPY[mode];
  const status = h("p", { class: "status" });
  const username = h("input", { name: "username", autocomplete: "username", required: "", minlength: "3" });
  const password = h("input", {
    name: "password",
    type: "password",
    autocomplete: mode === "login" ? "current-password" : "new-password",
    required: "",
    minlength: "8",
  });
  const button = h("button", { type: "submit" }, copy.button);
  const form = h(
    "form",
    { class: "card auth" },
    h("h1", {}, copy.title),
    h("label", {}, "Username", username),
    h("label", {}, "Password", password),
    button,
    status,
    h("a", { href: copy.switchHref }, copy.switchText),
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    button.disabled = true;
    showStatus(status, mode === "login" ? "Signing in…" : "Creating your account…");
    try {
      await api("POST", copy.endpoint, { username: username.value.trim(), password: password.value });
      if (mode === "register") await api("POST", COPY.login.endpoint, { username: username.value.trim(), password: password.value });
      const next = new URLSearchParams(location.search).get("next");
      location.assign(next && next.startsWith("/") && !next.startsWith("//") ? next : "/dashboard");
    } catch (error) {
      showStatus(status, error instanceof ApiError ? error.message : String(error), "error");
      button.disabled = false;
    }
  });
  root.replaceChildren(form);
  username.focus();
}
