/** The file tree: folders (click to fold) and files with open, rename/move and delete; a toolbar to create and
 * upload. Folders tools generate (bytecode caches, installed packages, virtual environments) are hidden unless asked for. */
import { h } from "../dom";
import { fileIcon, icon, withIcon, type IconName } from "../icons";
import type { FileEntry } from "./files";

export interface TreeActions {
  open: (path: string) => void;
  create: (kind: "file" | "directory") => void;
  rename: (path: string) => void;
  remove: (path: string) => void;
  upload: (files: FileList) => void;
  downloadUrl: (path: string) => string;
}

const GENERATED = new Set(["__pycache__", "node_modules", ".venv", "venv", ".pytest_cache", ".mypy_cache"]);
const SHOW_GENERATED_KEY = "codeyard-show-generated";

function generated(path: string): boolean {
  return path.split("/").some((part) => GENERATED.has(part));
}

/** A toolbar button: its icon, and its text (kept short; the title says more). */
function toolButton(id: string, iconName: IconName, text: string, title: string, secondary = true): HTMLButtonElement {
  return withIcon(h("button", { type: "button", class: secondary ? "small secondary" : "small", id, title }, text), iconName);
}

export class FileTree {
  readonly element: HTMLElement;
  private readonly list = h("ul", { class: "tree", id: "file-tree", role: "tree", "aria-label": "Files" });
  private activePath: string | null = null;
  private entries: FileEntry[] = [];
  private showGenerated = localStorage.getItem(SHOW_GENERATED_KEY) === "1";
  private readonly folded = new Set<string>();

  constructor(private readonly actions: TreeActions, private readonly canWrite: boolean, zipUrl: string) {
    const toolbar = h("div", { class: "tree-toolbar" });
    if (canWrite) {
      const newFile = toolButton("new-file", "newFile", "File", "New file", false);
      const newFolder = toolButton("new-folder", "newFolder", "Folder", "New folder");
      const picker = h("input", { type: "file", multiple: "", hidden: "", id: "upload-input" });
      const upload = toolButton("upload", "upload", "Upload", "Upload files");
      newFile.addEventListener("click", () => actions.create("file"));
      newFolder.addEventListener("click", () => actions.create("directory"));
      upload.addEventListener("click", () => picker.click());
      picker.addEventListener("change", () => {
        if (picker.files?.length) actions.upload(picker.files);
        picker.value = "";
      });
      toolbar.append(newFile, newFolder, upload, picker);
    }
    toolbar.append(withIcon(h("a", { class: "button small secondary", id: "download-zip", href: zipUrl, download: "", title: "Download the project as a zip" }, "Zip"), "download"));
    const toggle = h("input", { type: "checkbox", id: "show-generated" });
    toggle.checked = this.showGenerated;
    toggle.addEventListener("change", () => {
      this.showGenerated = toggle.checked;
      localStorage.setItem(SHOW_GENERATED_KEY, toggle.checked ? "1" : "0");
      this.render(this.entries);
    });
    const options = h("label", { class: "inline tree-options", title: "__pycache__, node_modules, .venv…" }, toggle, "Show generated folders");
    this.element = h("nav", { class: "tree-pane" }, h("h2", { class: "pane-title" }, "Files"), toolbar, this.list, options);
  }

  /** Show `section` (the project search) between the toolbar and the files. */
  addSection(section: HTMLElement): void {
    this.list.before(section);
  }

  paths(): string[] {
    return this.entries.map((entry) => entry.path);
  }

  setActive(path: string | null): void {
    this.activePath = path;
    for (const item of this.list.querySelectorAll<HTMLElement>("li[data-path]")) {
      item.classList.toggle("active", item.dataset.path === path);
    }
  }

  render(entries: FileEntry[]): void {
    this.entries = entries;
    const shown = entries.filter((entry) => (this.showGenerated || !generated(entry.path)) && !this.insideFolded(entry.path));
    this.list.replaceChildren(...shown.map((entry) => this.item(entry)));
    if (shown.length === 0) this.list.append(h("li", { class: "empty" }, "No files yet."));
    this.setActive(this.activePath);
  }

  private insideFolded(path: string): boolean {
    const parts = path.split("/");
    return parts.slice(0, -1).some((_, i) => this.folded.has(parts.slice(0, i + 1).join("/")));
  }

  private toggleFolder(path: string): void {
    if (!this.folded.delete(path)) this.folded.add(path);
    this.render(this.entries);
  }

  private item(entry: FileEntry): HTMLElement {
    const depth = entry.path.split("/").length - 1;
    const label = entry.path.split("/").pop() ?? entry.path;
    const item = h("li", { "data-path": entry.path, "data-kind": entry.kind, role: "treeitem", style: `padding-left:${depth * 0.9}rem` });
    if (entry.kind === "file") {
      const open = h("button", { type: "button", class: "link file", title: entry.path }, fileIcon(entry.path), h("span", { class: "name" }, label));
      open.addEventListener("click", () => this.actions.open(entry.path));
      item.append(open);
    } else {
      const open = !this.folded.has(entry.path);
      const folder = h("button", { type: "button", class: "link folder", title: open ? "Fold" : "Unfold", "aria-expanded": String(open) },
        icon(open ? "folderOpen" : "folder"), h("span", { class: "name" }, label));
      folder.addEventListener("click", () => this.toggleFolder(entry.path));
      item.append(folder);
    }
    const actions = h("span", { class: "item-actions" });
    if (entry.kind === "file") {
      const label = `Download ${entry.path}`;
      actions.append(h("a", { class: "icon download", href: this.actions.downloadUrl(entry.path), download: "", title: label, "aria-label": label }, icon("download")));
    }
    if (this.canWrite) {
      const rename = h("button", { type: "button", class: "icon rename", title: `Rename or move ${entry.path}`, "aria-label": `Rename ${entry.path}` }, icon("rename"));
      const remove = h("button", { type: "button", class: "icon delete", title: `Delete ${entry.path}`, "aria-label": `Delete ${entry.path}` }, icon("delete"));
      rename.addEventListener("click", () => this.actions.rename(entry.path));
      remove.addEventListener("click", () => this.actions.remove(entry.path));
      actions.append(rename, remove);
    }
    if (actions.childElementCount) item.append(actions);
    return item;
  }
}
