/** Project page: file tree and a plain text editor over the files API (the live editor replaces it). */
import { api, ApiError, send } from "../api";
import { h, showStatus } from "../dom";

interface FileEntry {
  path: string;
  kind: "file" | "directory" | "symlink";
  size: number;
}

interface Project {
  id: string;
  name: string;
  role: "owner" | "editor" | "viewer" | null;
}

export async function renderProject(root: HTMLElement, projectId: string): Promise<void> {
  const base = `/api/projects/${encodeURIComponent(projectId)}`;
  const status = h("p", { class: "status" });
  const tree = h("ul", { class: "tree", id: "file-tree" });
  const editor = h("textarea", { class: "editor", spellcheck: "false", "aria-label": "File contents" });
  const save = h("button", { type: "button" }, "Save");
  const title = h("strong", {}, "Codeyard");
  const fileName = h("span", { class: "file-name" });
  root.replaceChildren(
    h("header", { class: "topbar" }, h("a", { href: "/dashboard" }, "← Projects"), title, fileName, save),
    h("main", { class: "project-page" }, h("nav", {}, tree), h("section", {}, editor, status)),
  );

  let project: Project;
  try {
    project = await api<Project>("GET", base);
  } catch (error) {
    if (error instanceof ApiError && error.status === 401) return location.assign(`/login?next=${encodeURIComponent(location.pathname)}`);
    showStatus(status, (error as ApiError).message, "error");
    return;
  }
  title.textContent = project.name;
  const canWrite = project.role === "owner" || project.role === "editor";
  editor.readOnly = !canWrite;
  save.hidden = !canWrite;
  let openPath: string | null = null;

  async function open(path: string): Promise<void> {
    try {
      const response = await send("GET", `${base}/files/content/${path.split("/").map(encodeURIComponent).join("/")}`);
      editor.value = await response.text();
      openPath = path;
      fileName.textContent = path;
      showStatus(status, canWrite ? "" : "Read-only: you are a viewer of this project.");
    } catch (error) {
      showStatus(status, (error as ApiError).message, "error");
    }
  }

  save.addEventListener("click", async () => {
    if (openPath === null) return;
    try {
      await send("PUT", `${base}/files/content/${openPath.split("/").map(encodeURIComponent).join("/")}`, editor.value, "application/octet-stream");
      showStatus(status, `Saved ${openPath}.`);
    } catch (error) {
      showStatus(status, (error as ApiError).message, "error");
    }
  });

  const entries = await api<FileEntry[]>("GET", `${base}/files`);
  tree.replaceChildren(
    ...entries.map((entry) => {
      const depth = entry.path.split("/").length - 1;
      const label = entry.path.split("/").pop() ?? entry.path;
      const item = h("li", { style: `padding-left:${depth}rem`, "data-path": entry.path });
      if (entry.kind === "file") {
        const link = h("button", { type: "button", class: "link" }, label);
        link.addEventListener("click", () => void open(entry.path));
        item.append(link);
      } else {
        item.append(h("span", { class: "folder" }, `${label}/`));
      }
      return item;
    }),
  );
  const first = entries.find((entry) => entry.kind === "file");
  if (first) await open(first.path);
}
