/** The secrets editor of the deploy panel: names with masked values, add/replace/delete, and the
 * owner's switch that gives the secrets to runs too. Values are write-only: the server never sends
 * them back, so the list can only ever show a mask. */
import { api, ApiError } from "../api";
import { h, showStatus } from "../dom";

interface Secret {
  name: string;
  is_set: boolean;
  updated_at: string;
  updated_by: string | null;
}

interface Secrets {
  expose_to_runs: boolean;
  secrets: Secret[];
}

const MASK = "••••••••";

export class SecretsEditor {
  readonly element = h("section", { class: "deploy-secrets", id: "deploy-secrets" });
  private readonly list = h("ul", { class: "secret-list", id: "secret-list" });
  private readonly name = h("input", { id: "secret-name", placeholder: "NAME", autocomplete: "off", spellcheck: "false", maxlength: "64" });
  private readonly value = h("input", { id: "secret-value", type: "password", placeholder: "value", autocomplete: "new-password" });
  private readonly exposeToRuns = h("input", { type: "checkbox", id: "secret-expose" });
  private readonly status = h("p", { class: "status", id: "secret-status" });
  private readonly base: string;

  constructor(projectId: string, private readonly isOwner: boolean) {
    this.base = `/api/projects/${encodeURIComponent(projectId)}/secrets`;
    const save = h("button", { type: "submit", id: "secret-save" }, "Save secret");
    const form = h("form", { class: "row secret-form" }, this.name, this.value, save);
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      void this.save();
    });
    this.exposeToRuns.disabled = !isOwner;
    this.exposeToRuns.addEventListener("change", () => void this.setExposed(this.exposeToRuns.checked));
    const exposeLabel = h("label", { class: "inline", title: isOwner ? "" : "Only owners can change this" }, this.exposeToRuns,
      "Also give them to runs (deploys always get them)");
    this.element.append(
      h("h3", {}, "Environment variables and secrets"),
      h("p", { class: "hint" }, "Values are encrypted and never shown again after saving."),
      this.list,
      form,
      exposeLabel,
      this.status,
    );
  }

  async load(): Promise<void> {
    try {
      this.render(await api<Secrets>("GET", this.base));
    } catch (error) {
      showStatus(this.status, (error as ApiError).message, "error");
    }
  }

  private render(secrets: Secrets): void {
    this.exposeToRuns.checked = secrets.expose_to_runs;
    this.list.replaceChildren(...secrets.secrets.map((secret) => this.item(secret)));
    if (secrets.secrets.length === 0) this.list.append(h("li", { class: "empty" }, "No secrets yet."));
  }

  private item(secret: Secret): HTMLElement {
    const replace = h("button", { type: "button", class: "secondary small" }, "Replace");
    replace.addEventListener("click", () => {
      this.name.value = secret.name;
      this.value.value = "";
      this.value.focus();
    });
    const remove = h("button", { type: "button", class: "small danger" }, "Delete");
    remove.addEventListener("click", () => void this.remove(secret.name));
    const when = new Date(secret.updated_at).toLocaleString();
    return h(
      "li",
      { "data-name": secret.name },
      h("code", { class: "secret-name" }, secret.name),
      h("span", { class: "secret-mask", "aria-label": "value hidden" }, MASK),
      h("small", {}, `${when}${secret.updated_by ? ` · ${secret.updated_by}` : ""}`),
      replace,
      remove,
    );
  }

  private async save(): Promise<void> {
    const name = this.name.value.trim();
    if (!name) return showStatus(this.status, "Give the secret a name, e.g. API_KEY.", "error");
    try {
      await api("PUT", `${this.base}/${encodeURIComponent(name)}`, { value: this.value.value });
      this.name.value = "";
      this.value.value = "";
      showStatus(this.status, `Saved ${name}. Redeploy for the app to see it.`);
      await this.load();
    } catch (error) {
      showStatus(this.status, (error as ApiError).message, "error");
    }
  }

  private async remove(name: string): Promise<void> {
    if (!confirm(`Delete the secret ${name}? Deployed apps keep it until the next deploy.`)) return;
    try {
      await api("DELETE", `${this.base}/${encodeURIComponent(name)}`);
      showStatus(this.status, `Deleted ${name}.`);
      await this.load();
    } catch (error) {
      showStatus(this.status, (error as ApiError).message, "error");
    }
  }

  private async setExposed(expose: boolean): Promise<void> {
    if (!this.isOwner) return;
    try {
      this.render(await api<Secrets>("PATCH", this.base, { expose_to_runs: expose }));
      showStatus(this.status, expose ? "Runs get these variables now." : "Runs no longer get these variables.");
    } catch (error) {
      showStatus(this.status, (error as ApiError).message, "error");
    }
  }
}
