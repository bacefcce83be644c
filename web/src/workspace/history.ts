/** The history panel: checkpoints of the open file (or the project), their names, their changes, and restore. */
import { api, ApiError } from "../api";
import { h, showStatus } from "../dom";

interface Checkpoint {
  version: string;
  message: string;
  authors: { name: string }[];
  created_at: string;
  names: string[];
}

export class HistoryPanel {
  readonly element = h("dialog", { id: "history-dialog", class: "card dialog wide" });
  private readonly list = h("ol", { class: "checkpoints", id: "checkpoints" });
  private readonly diff = h("pre", { class: "diff", id: "diff", hidden: "" });
  private readonly status = h("p", { class: "status" });
  private readonly title = h("h2", {});
  private readonly wholeProject = h("input", { type: "checkbox", id: "history-project" });
  private readonly newName = h("input", {
    type: "text", id: "checkpoint-name", maxlength: "64", placeholder: "e.g. before-loops",
    "aria-label": "Checkpoint name", required: "",
  });
  private readonly base: string;
  private path: string | null = null;

  constructor(projectId: string, private readonly canWrite: boolean) {
    this.base = `/api/projects/${encodeURIComponent(projectId)}/history`;
    const close = h("button", { type: "button", class: "secondary", id: "history-close" }, "Close");
    close.addEventListener("click", () => this.element.close());
    const save = h("button", { type: "button", id: "checkpoint-now" }, "Save a checkpoint now");
    save.hidden = !canWrite;
    save.addEventListener("click", async () => {
      showStatus(this.status, await this.checkpoint());
      await this.load();
    });
    const saveAs = h("form", { class: "row", id: "checkpoint-save-as" }, this.newName,
      h("button", { type: "submit", class: "secondary" }, "Save checkpoint as…"));
    saveAs.hidden = !canWrite;
    saveAs.addEventListener("submit", async (event) => {
      event.preventDefault();
      const name = this.newName.value.trim();
      try {
        await api("POST", this.base, { message: "Checkpoint", name });  // names the last one when nothing changed
        this.newName.value = "";
        showStatus(this.status, `Checkpoint saved as “${name}”.`);
        await this.load();
      } catch (error) {
        showStatus(this.status, (error as ApiError).message, "error");
      }
    });
    this.wholeProject.addEventListener("change", () => void this.load());
    this.element.append(
      this.title,
      h("div", { class: "row" }, h("label", { class: "inline" }, this.wholeProject, "Whole project"), save),
      saveAs,
      this.list,
      this.diff,
      this.status,
      close,
    );
  }

  /** Commits the project now; returns a sentence for the user. */
  async checkpoint(): Promise<string> {
    try {
      const made = await api<Checkpoint | null>("POST", this.base, { message: "Checkpoint" });
      return made ? "Checkpoint saved. Find it under History." : "Nothing changed since the last checkpoint.";
    } catch (error) {
      return error instanceof ApiError ? `Could not save a checkpoint: ${error.message}` : String(error);
    }
  }

  async open(path: string | null): Promise<void> {
    this.path = path;
    this.wholeProject.checked = path === null;
    this.wholeProject.disabled = path === null;
    this.element.showModal();
    await this.load();
  }

  private scope(): string | null {
    return this.wholeProject.checked ? null : this.path;
  }

  private async load(): Promise<void> {
    const path = this.scope();
    this.title.textContent = path ? `History of ${path}` : "History of the project";
    this.diff.hidden = true;
    let checkpoints: Checkpoint[];
    try {
      checkpoints = await api<Checkpoint[]>("GET", path ? `${this.base}?path=${encodeURIComponent(path)}` : this.base);
    } catch (error) {
      return showStatus(this.status, (error as ApiError).message, "error");
    }
    this.list.replaceChildren(...checkpoints.map((checkpoint, index) => this.item(checkpoint, checkpoints[index + 1] ?? null)));
    if (checkpoints.length === 0) this.list.append(h("li", { class: "empty" }, "No checkpoints yet. Press Ctrl+S or run your program to make one."));
  }

  private item(checkpoint: Checkpoint, previous: Checkpoint | null): HTMLElement {
    const when = new Date(checkpoint.created_at).toLocaleString();
    const who = checkpoint.authors.map((author) => author.name).join(", ");
    const names = checkpoint.names.map((name) => h("span", { class: "badge checkpoint-name" }, name));
    const item = h(
      "li",
      { "data-version": checkpoint.version },
      h("div", { class: "checkpoint-text" }, h("strong", {}, checkpoint.message), ...names, h("small", {}, `${when} · ${who}`)),
    );
    const actions = h("span", { class: "actions" });
    if (previous) {
      const show = h("button", { type: "button", class: "secondary small show-diff" }, "Changes");
      show.addEventListener("click", () => void this.showDiff(previous.version, checkpoint.version));
      actions.append(show);
    }
    if (this.canWrite) {
      const name = h("button", { type: "button", class: "secondary small name-checkpoint" }, "Name…");
      name.addEventListener("click", () => void this.name(checkpoint));
      const restore = h("button", { type: "button", class: "small restore" }, "Restore");
      restore.addEventListener("click", () => void this.restore(checkpoint));
      actions.append(name, restore);
    }
    item.append(actions);
    return item;
  }

  private async showDiff(old: string, next: string): Promise<void> {
    const path = this.scope();
    const query = new URLSearchParams({ old, new: next, ...(path ? { path } : {}) });
    try {
      const { diff } = await api<{ diff: string }>("GET", `${this.base}/diff?${query}`);
      this.diff.replaceChildren(
        ...diff.split("\n").map((line) => {
          const kind = line.startsWith("+") && !line.startsWith("+++") ? "add" : line.startsWith("-") && !line.startsWith("---") ? "del" : "ctx";
          return h("span", { class: `diff-${kind}` }, `${line}\n`);
        }),
      );
      if (!diff) this.diff.textContent = "No changes to this file in that checkpoint.";
      this.diff.hidden = false;
    } catch (error) {
      showStatus(this.status, (error as ApiError).message, "error");
    }
  }

  private async name(checkpoint: Checkpoint): Promise<void> {
    const name = prompt("Name this checkpoint (letters, digits, '.', '_' or '-'):")?.trim();
    if (!name) return;
    try {
      await api("POST", `${this.base}/${checkpoint.version}/name`, { name });
      showStatus(this.status, `Named it “${name}”.`);
      await this.load();
    } catch (error) {
      showStatus(this.status, (error as ApiError).message, "error");
    }
  }

  private async restore(checkpoint: Checkpoint): Promise<void> {
    const path = this.scope();
    const what = path ?? "every file of the project";
    if (!confirm(`Put ${what} back as it was at “${checkpoint.message}” (${new Date(checkpoint.created_at).toLocaleString()})? Everyone editing sees the change.`)) return;
    try {
      await api("POST", `${this.base}/restore`, { version: checkpoint.version, ...(path ? { path } : {}) });
      showStatus(this.status, `Restored ${what}.`);
    } catch (error) {
      showStatus(this.status, (error as ApiError).message, "error");
    }
  }
}
