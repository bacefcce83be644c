/** The workspace: file tree, tabs of collaborative editors, presence, run console, shell, themes. */
import { keymap } from "@codemirror/view";
import { api, ApiError } from "../api";
import { h, showStatus } from "../dom";
import { colorFor } from "./colors";
import { FileEditor, type Connection } from "./editor";
import { ProjectFiles } from "./files";
import { FileTree } from "./tree";
import { RunConsole, type RunStarted } from "./runconsole";
import { WebviewPane } from "./webview";
import { ProjectSearch } from "./search";
import { HistoryPanel } from "./history";
import { AssistantUi } from "./assistant";
import { attachLesson } from "./lesson";
import { DeployPanel } from "./deploy";
import { ShareDialog } from "./share";
import { ShellPane } from "./shell";
import { socketUrl } from "./terminal";
import { onEditorSettingsSaved } from "../settings";
import { icon, withIcon } from "../icons";

interface Project {
  id: string;
  name: string;
  visibility: "private" | "public";
  role: "owner" | "editor" | "viewer" | null;
}

interface PresenceUser {
  id: number;
  username: string;
  role: string;
  file: string | null;
}

type ProjectEvent =
  | { type: "files"; action: string; path: string; to: string | null }
  | { type: "presence"; users: PresenceUser[] }
  | ({ type: "run" } & RunStarted);

const CONNECTION_TEXT: Record<Connection, string> = {
  connecting: "Connecting…",
  synced: "Synced",
  offline: "Offline: your edits are kept and will merge when you reconnect",
  denied: "No access",
  snapshot: "Saved version (sign in and join to see live edits)",
};

const RUN_TITLE = "Run (Ctrl+Enter)";
const STOP_TITLE = "Stop the program (Ctrl+C in the console)";

function preferredDark(): boolean {
  const saved = localStorage.getItem("codeyard-theme");
  return saved ? saved === "dark" : matchMedia("(prefers-color-scheme: dark)").matches;
}

export class Workspace {
  private readonly files: ProjectFiles;
  private readonly tree: FileTree;
  private readonly editors = new Map<string, { editor: FileEditor; tab: HTMLElement; host: HTMLElement }>();
  private active: string | null = null;
  private dark = preferredDark();
  private events: WebSocket | null = null;
  private readonly message = h("p", { class: "status", id: "message" });
  private readonly connection = h("span", { class: "connection", id: "connection", role: "status" }, "Connecting…");
  private readonly presence = h("div", { class: "presence", id: "presence", "aria-label": "People in this project" });
  private readonly tabs = h("div", { class: "tabs", id: "tabs", role: "tablist" });
  private readonly editorArea = h("div", { class: "editor-area", id: "editor" });
  private readonly runButton = withIcon(h("button", { type: "button", id: "run", title: RUN_TITLE }, "Run"), "run");
  private readonly runSummary = h("span", { class: "run-summary", id: "run-summary" });
  private runConsole: RunConsole | null = null;
  private history: HistoryPanel | null = null;
  private shell: ShellPane | null = null;
  private readonly assistant: AssistantUi | null;
  private readonly search: ProjectSearch;

  constructor(private readonly root: HTMLElement, private readonly project: Project, private readonly username: string) {
    this.files = new ProjectFiles(project.id);
    this.assistant = this.canWrite ? new AssistantUi(project.id, { activePath: () => this.active, openFiles: () => this.openFiles() }) : null;
    this.tree = new FileTree(
      {
        open: (path) => this.open(path),
        create: (kind) => void this.createEntry(kind),
        rename: (path) => void this.renameEntry(path),
        remove: (path) => void this.removeEntry(path),
        upload: (list) => void this.upload(list),
        downloadUrl: (path) => this.files.downloadUrl(path),
      },
      this.canWrite,
      this.files.zipUrl,
    );
    this.search = new ProjectSearch(this.files, (path, line) => {
      this.open(path);
      this.editors.get(path)?.editor.goToLine(line);
    });
    this.tree.addSection(this.search.element);
  }

  get canWrite(): boolean {
    return this.project.role === "owner" || this.project.role === "editor";
  }

  private get storageKey(): string {
    return `codeyard-tabs:${this.project.id}`;
  }

  async start(): Promise<void> {
    this.applyTheme();
    this.layout();
    void this.assistant?.start();
    const main = this.root.querySelector<HTMLElement>("main.workspace");
    if (main && this.project.role !== null) void attachLesson(main, this.project.id, this.canWrite); // visitors may not read lessons
    this.connectEvents();
    void this.followLiveRun();
    document.addEventListener("keydown", (event) => this.shortcut(event));
    onEditorSettingsSaved((settings) => {
      for (const { editor } of this.editors.values()) void editor.applySettings(settings);
      this.dark = preferredDark();
      this.applyTheme();
    });
    await this.refreshTree();
    const saved = JSON.parse(localStorage.getItem(this.storageKey) ?? "null") as { open: string[]; active: string | null } | null;
    const existing = new Set(this.tree.paths());
    const toOpen = (saved?.open ?? []).filter((path) => existing.has(path));
    if (toOpen.length === 0) {
      const first = this.tree.paths().find((path) => /^main\.|\.py$/.test(path)) ?? this.tree.paths()[0];
      if (first) toOpen.push(first);
    }
    for (const path of toOpen) this.open(path);
    if (saved?.active && this.editors.has(saved.active)) this.activate(saved.active);
  }

  private layout(): void {
    const themeButton = h("button", { type: "button", class: "secondary icon-only", id: "theme", title: "Switch light/dark theme", "aria-label": "Switch light/dark theme" }, icon("theme"));
    themeButton.addEventListener("click", () => {
      this.dark = !this.dark;
      localStorage.setItem("codeyard-theme", this.dark ? "dark" : "light");
      this.applyTheme();
    });
    const share = new ShareDialog(this.project, this.username);
    const shareButton = withIcon(h("button", { type: "button", class: "secondary", id: "share" }, "Share"), "share");
    shareButton.hidden = this.project.role === null;
    shareButton.addEventListener("click", () => void share.open());
    const history = new HistoryPanel(this.project.id, this.canWrite);
    this.history = history;
    const historyButton = withIcon(h("button", { type: "button", class: "secondary", id: "history" }, "History"), "history");
    historyButton.addEventListener("click", () => void history.open(this.active));
    const deploy = new DeployPanel(this.project.id, this.canWrite, this.project.role === "owner");
    if (this.project.role !== null) void deploy.refreshBadge();
    withIcon(deploy.button, "deploy");
    if (this.assistant) withIcon(this.assistant.button, "assistant");
    this.runButton.hidden = !this.canWrite;
    this.runButton.addEventListener("click", () => void (this.runConsole?.running ? this.runConsole.stop() : this.run()));
    const roleBadge = h("span", { class: "badge", id: "role" }, this.project.role ?? "visitor");
    const consoleHost = h("div", { class: "terminal-host", id: "console" });
    const shellHost = h("div", { class: "terminal-host", id: "shell", hidden: "" });
    const consoleTab = h("button", { type: "button", class: "pane-tab active", id: "console-tab" }, "Console");
    const shellTab = h("button", { type: "button", class: "pane-tab", id: "shell-tab" }, "Shell");
    shellTab.hidden = !this.canWrite;
    const showPane = (pane: "console" | "shell" | "webview") => {
      consoleHost.hidden = pane !== "console";
      shellHost.hidden = pane !== "shell";
      webview.element.hidden = pane !== "webview";
      consoleTab.classList.toggle("active", pane === "console");
      shellTab.classList.toggle("active", pane === "shell");
      webview.tab.classList.toggle("active", pane === "webview");
      if (pane === "shell") {
        this.shell ??= new ShellPane(shellHost, this.dark, this.project.id);
        this.shell.connect();
        this.shell.term.refit();
      } else if (pane === "console") {
        this.runConsole?.term.refit();
      }
    };
    const webview = new WebviewPane(() => showPane("webview"));
    consoleTab.addEventListener("click", () => showPane("console"));
    shellTab.addEventListener("click", () => showPane("shell"));
    webview.tab.addEventListener("click", () => showPane("webview"));
    const readOnlyNote = this.canWrite ? "" : "Read-only: you can watch this project live but not change it.";
    this.root.replaceChildren(
      h(
        "header",
        { class: "topbar workspace-bar" },
        withIcon(h("a", { href: "/dashboard" }, "Projects"), "back"),
        h("strong", { id: "project-name" }, this.project.name),
        roleBadge,
        this.presence,
        this.connection,
        this.runButton,
        deploy.button,
        deploy.badge,
        historyButton,
        ...(this.assistant ? [this.assistant.status, this.assistant.button] : []),
        shareButton,
        themeButton,
      ),
      share.element,
      history.element,
      deploy.element,
      ...(this.assistant ? [this.assistant.panel] : []),
      h(
        "main",
        { class: "workspace" },
        this.tree.element,
        h("section", { class: "editor-pane" }, this.tabs, this.editorArea, h("p", { class: "status status-info", id: "readonly-note" }, readOnlyNote), this.message),
        h("section", { class: "run-pane" }, h("div", { class: "pane-tabs" }, consoleTab, shellTab, webview.tab, this.runSummary, ...(this.assistant ? [this.assistant.explainButton] : [])), consoleHost, shellHost, webview.element),
      ),
    );
    this.runConsole = new RunConsole(consoleHost, this.dark, this.project.id, this.username, this.canWrite, (running, summary, failedOutput) => {
      this.runButton.replaceChildren(icon(running ? "stop" : "run"), running ? "Stop" : "Run");
      this.runButton.title = running ? STOP_TITLE : RUN_TITLE;
      this.runButton.classList.toggle("danger", running);
      this.runSummary.textContent = summary;
      this.assistant?.runEnded(failedOutput);
    }, (url, port) => webview.show(url, port));
  }

  private applyTheme(): void {
    document.documentElement.dataset.theme = this.dark ? "dark" : "light";
    for (const { editor } of this.editors.values()) editor.setDark(this.dark);
    this.runConsole?.term.setDark(this.dark);
    this.shell?.term.setDark(this.dark);
  }

  private say(text: string, kind: "error" | "info" = "info"): void {
    showStatus(this.message, text, kind);
  }

  private fail(error: unknown): void {
    this.say(error instanceof ApiError ? error.message : String(error), "error");
  }

  // ----- files -----

  private async refreshTree(): Promise<void> {
    try {
      this.tree.render(await this.files.list());
    } catch (error) {
      this.fail(error);
    }
  }

  private async createEntry(kind: "file" | "directory"): Promise<void> {
    const path = prompt(kind === "file" ? "New file name (e.g. utils.py or src/app.js):" : "New folder name:")?.trim();
    if (!path) return;
    try {
      await this.files.create(path, kind);
      await this.refreshTree();
      if (kind === "file") this.open(path);
      this.say(`Created ${path}.`);
    } catch (error) {
      this.fail(error);
    }
  }

  private async renameEntry(path: string): Promise<void> {
    const target = prompt(`Rename or move “${path}” to:`, path)?.trim();
    if (!target || target === path) return;
    try {
      await this.files.move(path, target);
      this.say(`Renamed ${path} to ${target}.`);
      await this.refreshTree();
      this.followMove(path, target);
    } catch (error) {
      this.fail(error);
    }
  }

  private async removeEntry(path: string): Promise<void> {
    if (!confirm(`Delete “${path}”? This cannot be undone (history keeps checkpoints).`)) return;
    try {
      await this.files.remove(path);
      this.say(`Deleted ${path}.`);
      await this.refreshTree();
      this.closeMissing();
    } catch (error) {
      this.fail(error);
    }
  }

  private async upload(list: FileList): Promise<void> {
    const chosen = Array.from(list); // the picker's FileList empties when it is reset for the next upload
    try {
      for (const file of chosen) {
        this.say(`Uploading ${file.name}…`);
        await this.files.upload(file.name, file);
      }
      this.say(`Uploaded ${chosen.length} file${chosen.length === 1 ? "" : "s"}.`);
      await this.refreshTree();
    } catch (error) {
      this.fail(error);
    }
  }

  /** Tabs of files that were renamed reopen under the new name. */
  private followMove(src: string, dst: string): void {
    for (const path of [...this.editors.keys()]) {
      if (path === src || path.startsWith(`${src}/`)) {
        const wasActive = path === this.active;
        this.close(path);
        this.open(dst + path.slice(src.length), wasActive);
      }
    }
  }

  private closeMissing(): void {
    const existing = new Set(this.tree.paths());
    for (const path of [...this.editors.keys()]) {
      if (!existing.has(path)) {
        this.close(path);
        this.say(`${path} was deleted, so its tab was closed.`);
      }
    }
  }

  // ----- tabs and editors -----

  open(path: string, focus = true): void {
    if (!this.editors.has(path)) {
      const host = h("div", { class: "editor-host", "data-path": path });
      this.editorArea.append(host);
      const editor = new FileEditor(
        {
          projectId: this.project.id,
          path,
          username: this.username,
          readOnly: !this.canWrite,
          live: this.project.role !== null,
          dark: this.dark,
          extensions: [keymap.of([{ key: "Mod-Enter", run: () => (void this.run(), true) }]), this.assistant?.extension ?? []],
          onConnection: (state, detail) => {
            if (path !== this.active) return;
            this.showConnection(state);
            if (detail) this.say(detail, "error");
          },
        },
        host,
      );
      const label = h("button", { type: "button", class: "tab-label", role: "tab" }, path.split("/").pop() ?? path);
      const closeButton = h("button", { type: "button", class: "tab-close", "aria-label": `Close ${path}`, title: "Close" }, "×");
      const tab = h("div", { class: "tab", "data-path": path, title: path }, label, closeButton);
      label.addEventListener("click", () => this.activate(path));
      closeButton.addEventListener("click", () => this.close(path));
      this.tabs.append(tab);
      this.editors.set(path, { editor, tab, host });
    }
    if (focus || this.active === null) this.activate(path);
    this.saveTabs();
  }

  private activate(path: string): void {
    this.active = path;
    for (const [other, { tab, host }] of this.editors) {
      tab.classList.toggle("active", other === path);
      tab.setAttribute("aria-selected", String(other === path));
      host.hidden = other !== path;
    }
    this.tree.setActive(path);
    const current = this.editors.get(path);
    if (current) {
      this.showConnection(current.editor.connection());
      current.editor.view.focus();
    }
    this.sendPresence();
    this.saveTabs();
  }

  private close(path: string): void {
    const entry = this.editors.get(path);
    if (!entry) return;
    entry.editor.destroy();
    entry.tab.remove();
    entry.host.remove();
    this.editors.delete(path);
    if (this.active === path) {
      this.active = null;
      const next = [...this.editors.keys()].pop();
      if (next) this.activate(next);
      else {
        this.tree.setActive(null);
        this.sendPresence();
      }
    }
    this.saveTabs();
  }

  /** The open files' current text, the active one first (the assistant's context). */
  private openFiles(): { path: string; content: string }[] {
    const paths = [...this.editors.keys()].sort((a, b) => Number(b === this.active) - Number(a === this.active));
    return paths.map((path) => ({ path, content: this.editors.get(path)!.editor.view.state.doc.toString() }));
  }

  private saveTabs(): void {
    localStorage.setItem(this.storageKey, JSON.stringify({ open: [...this.editors.keys()], active: this.active }));
  }

  private showConnection(state: Connection): void {
    this.connection.textContent = CONNECTION_TEXT[state];
    this.connection.dataset.state = state;
  }

  // ----- project events and presence -----

  private connectEvents(attempt = 0): void {
    const socket = new WebSocket(socketUrl(`/ws/projects/${encodeURIComponent(this.project.id)}/events`));
    this.events = socket;
    socket.onopen = () => {
      attempt = 0;
      this.sendPresence();
      void this.refreshTree().then(() => this.closeMissing());
    };
    socket.onmessage = (message) => this.onEvent(JSON.parse(String(message.data)) as ProjectEvent);
    socket.onclose = (event) => {
      this.events = null;
      if (event.code === 4401) return this.say("Your session has ended. Please sign in again to keep working.", "error");
      if (event.code === 4403) return this.say(event.reason || "You no longer have access to this project.", "error");
      setTimeout(() => this.connectEvents(attempt + 1), Math.min(5000, 500 * 2 ** attempt));
    };
  }

  private sendPresence(): void {
    if (this.events?.readyState === WebSocket.OPEN) this.events.send(JSON.stringify({ type: "presence", file: this.active }));
  }

  private onEvent(event: ProjectEvent): void {
    if (event.type === "presence") this.renderPresence(event.users);
    else if (event.type === "run" && this.project.role !== null) this.runConsole?.watch(event); // runs are members' only
    else if (event.type === "files") {
      void this.refreshTree().then(() => {
        if (event.action === "move" && event.to) this.followMove(event.path, event.to);
        else this.closeMissing();
      });
    }
  }

  private renderPresence(users: PresenceUser[]): void {
    const byName = new Map<string, PresenceUser>();
    for (const user of users) if (!byName.has(user.username) || user.file) byName.set(user.username, user);
    this.presence.replaceChildren(
      ...[...byName.values()].map((user) => {
        const where = user.file ? `in ${user.file}` : "in the project";
        const self = user.username === this.username ? " (you)" : "";
        return h(
          "span",
          { class: "avatar", style: `background:${colorFor(user.username)}`, title: `${user.username}${self} — ${where}`, "data-user": user.username, "data-file": user.file ?? "" },
          user.username.slice(0, 2).toUpperCase(),
        );
      }),
    );
  }

  // ----- run and shortcuts -----

  private async run(): Promise<void> {
    if (!this.canWrite) return this.say("Only editors can run this project.", "error");
    const entry = this.active && /\.(py|js|mjs|ts|c|cc|cpp|sh|rb|go|rs|java)$/.test(this.active) ? this.active : null;
    await this.runConsole?.start(entry);
  }

  /** A workspace opened while a run goes follows it, as it would have from its start. */
  private async followLiveRun(): Promise<void> {
    if (this.project.role === null) return;
    type Listed = { id: string; status: string; username: string | null; argv: string[] };
    const runs = await api<Listed[]>("GET", `/api/projects/${encodeURIComponent(this.project.id)}/runs`).catch(() => []);
    const live = runs.find((run) => run.status !== "finished");
    if (live) this.runConsole?.watch({ id: live.id, username: live.username ?? "someone", argv: live.argv, interactive: false });
  }

  private shortcut(event: KeyboardEvent): void {
    if (event.defaultPrevented) return; // the editor already handled it (its keymap runs Ctrl+Enter too)
    const mod = event.ctrlKey || event.metaKey;
    if (mod && event.key === "Enter") {
      event.preventDefault();
      void this.run();
    } else if (mod && event.key.toLowerCase() === "s") {
      event.preventDefault();
      if (!this.canWrite || !this.history) this.say("Viewers can't save checkpoints.");
      else void this.history.checkpoint().then((text) => this.say(text));
    }
  }
}

export async function renderWorkspace(root: HTMLElement, projectId: string): Promise<void> {
  const status = h("p", { class: "status" });
  root.replaceChildren(h("main", { class: "loading" }, h("p", {}, "Opening the project…"), status));
  try {
    const project = await api<Project>("GET", `/api/projects/${encodeURIComponent(projectId)}`);
    const me = await api<{ username: string }>("GET", "/api/me").catch(() => ({ username: "guest" }));
    await new Workspace(root, project, me.username).start();
  } catch (error) {
    if (error instanceof ApiError && error.status === 401) return location.assign(`/login?next=${encodeURIComponent(location.pathname)}`);
    showStatus(status, error instanceof ApiError && error.status === 404 ? "This project does not exist, or you don't have access to it." : (error as Error).message, "error");
  }
}


