/** The files API of one project, as the workspace uses it. */
import { api, send } from "../api";
import type { FileEntry, SearchResults } from "../api/types";

export type { FileEntry, SearchResults };

export function encodePath(path: string): string {
  return path.split("/").map(encodeURIComponent).join("/");
}

export class ProjectFiles {
  private readonly base: string;

  constructor(projectId: string) {
    this.base = `/api/projects/${encodeURIComponent(projectId)}/files`;
  }

  list(): Promise<FileEntry[]> {
    return api<FileEntry[]>("GET", this.base);
  }

  search(query: string): Promise<SearchResults> {
    return api<SearchResults>("GET", `${this.base}/search?q=${encodeURIComponent(query)}`);
  }

  /** Where the browser saves one file from, under its own name. */
  downloadUrl(path: string): string {
    return `${this.base}/content/${encodePath(path)}?download=true`;
  }

  /** Where the browser saves the whole project from, as a zip. */
  get zipUrl(): string {
    return `${this.base}/zip`;
  }

  create(path: string, kind: "file" | "directory"): Promise<FileEntry> {
    return api<FileEntry>("POST", this.base, { path, kind, content: "" });
  }

  move(src: string, dst: string): Promise<FileEntry> {
    return api<FileEntry>("POST", `${this.base}/move`, { src, dst });
  }

  async remove(path: string): Promise<void> {
    await send("DELETE", `${this.base}/content/${encodePath(path)}`);
  }

  async upload(path: string, data: Blob): Promise<void> {
    await send("PUT", `${this.base}/content/${encodePath(path)}`, data, "application/octet-stream");
  }
}
