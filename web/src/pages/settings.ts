/** Settings: the editor's preferences (this browser) and the account (password, API tokens). */
import { api, ApiError } from "../api";
import { h, showStatus } from "../dom";
import { withIcon } from "../icons";
import { editorSettings, saveEditorSettings, type EditorSettings } from "../settings";

interface Token {
  id: string;
  name: string;
  created_at: string;
  last_used_at?: string | null;
}

function choice(name: string, label: string, options: [string, string][], value: string): HTMLLabelElement {
  const select = h("select", { name, id: `setting-${name}` }, ...options.map(([v, text]) => h("option", { value: v }, text)));
  select.value = value;
  return h("label", {}, label, select);
}

function editorSection(): HTMLElement {
  const current = editorSettings();
  const status = h("p", { class: "status", id: "editor-status" });
  const form = h(
    "form",
    { class: "card settings", id: "editor-settings" },
    h("h2", {}, "Editor"),
    choice("indent", "Indentation", [["2", "2 spaces"], ["4", "4 spaces"], ["8", "8 spaces"], ["0", "Tabs"]], String(current.indent)),
    choice("fontSize", "Font size", [12, 13, 14, 16, 18, 20, 24].map((n) => [String(n), `${n} px`]), String(current.fontSize)),
    choice("keys", "Key bindings", [["default", "Default"], ["vim", "Vim"], ["emacs", "Emacs"]], current.keys),
    choice("theme", "Theme", [["system", "Same as the system"], ["light", "Light"], ["dark", "Dark"]], current.theme),
    h("button", { type: "submit" }, "Save"),
    status,
  );
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const data = new FormData(form);
    const settings: EditorSettings = {
      indent: Number(data.get("indent")),
      fontSize: Number(data.get("fontSize")),
      keys: data.get("keys") as EditorSettings["keys"],
      theme: data.get("theme") as EditorSettings["theme"],
    };
    saveEditorSettings(settings);
    showStatus(status, "Saved. Open editors follow at once.");
  });
  return form;
}

function passwordSection(): HTMLElement {
  const current = h("input", { type: "password", name: "current", autocomplete: "current-password", required: "" });
  const next = h("input", { type: "password", name: "new", autocomplete: "new-password", required: "" });
  const status = h("p", { class: "status", id: "password-status" });
  const form = h(
    "form",
    { class: "card settings", id: "password-form" },
    h("h2", {}, "Password"),
    h("label", {}, "Current password", current),
    h("label", {}, "New password", next),
    h("button", { type: "submit" }, "Change password"),
    status,
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    try {
      await api("POST", "/api/me/password", { current_password: current.value, new_password: next.value });
      form.reset();
      showStatus(status, "Password changed. Your other browsers were signed out.");
    } catch (error) {
      showStatus(status, error instanceof ApiError ? error.message : String(error), "error");
    }
  });
  return form;
}

function tokensSection(): HTMLElement {
  const list = h("ul", { class: "projects", id: "tokens" });
  const name = h("input", { name: "name", required: "", maxlength: "100", placeholder: "laptop script", "aria-label": "Token name" });
  const shown = h("pre", { id: "new-token", hidden: "" });
  const status = h("p", { class: "status" });
  const form = h("form", { class: "create" }, name, h("button", { type: "submit" }, "Create token"));
  const refresh = async () => {
    const tokens = await api<Token[]>("GET", "/api/tokens");
    list.replaceChildren(
      ...tokens.map((token) => {
        const revoke = h("button", { type: "button", class: "danger" }, "Revoke");
        revoke.addEventListener("click", async () => {
          await api("DELETE", `/api/tokens/${encodeURIComponent(token.id)}`);
          await refresh();
        });
        return h("li", { class: "project", "data-token": token.name }, h("span", {}, token.name), revoke);
      }),
    );
    if (!tokens.length) list.append(h("li", { class: "empty" }, "No tokens."));
  };
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    try {
      const created = await api<{ token: string }>("POST", "/api/tokens", { name: name.value.trim() });
      shown.hidden = false;
      shown.textContent = created.token;
      showStatus(status, "Copy the token now: it is shown only once. Send it as 'Authorization: Bearer <token>'.");
      form.reset();
      await refresh();
    } catch (error) {
      showStatus(status, error instanceof ApiError ? error.message : String(error), "error");
    }
  });
  void refresh();
  return h("section", { class: "card settings" }, h("h2", {}, "API tokens"), form, shown, status, list);
}

export async function renderSettings(root: HTMLElement): Promise<void> {
  let username: string;
  try {
    username = (await api<{ username: string }>("GET", "/api/me")).username;
  } catch (error) {
    if (error instanceof ApiError && error.status === 401) return location.assign("/login?next=/settings");
    throw error;
  }
  root.replaceChildren(
    h("header", { class: "topbar" }, withIcon(h("a", { href: "/dashboard" }, "Projects"), "back"), h("strong", {}, "Settings"), h("span", {}, `Signed in as ${username}`)),
    h("main", { class: "dashboard" }, editorSection(), passwordSection(), tokensSection()),
  );
}
