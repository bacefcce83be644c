/** Search across the project's files: a box in the file pane and a list of matching lines; a click opens the line. */
import { ApiError } from "../api";
import { h } from "../dom";
import { icon } from "../icons";
import type { ProjectFiles } from "./files";

export class ProjectSearch {
  private readonly input = h("input", { type: "search", id: "project-search", placeholder: "Search in files…", "aria-label": "Search in files" });
  private readonly results = h("ul", { class: "search-results", id: "search-results", "aria-label": "Search results" });
  readonly element = h("form", { class: "project-search", role: "search" }, h("label", { class: "search-box" }, icon("search"), this.input), this.results);

  constructor(private readonly files: ProjectFiles, private readonly openAt: (path: string, line: number) => void) {
    this.element.addEventListener("submit", (event) => {
      event.preventDefault();
      void this.run();
    });
    this.input.addEventListener("search", () => {
      if (!this.input.value) this.results.replaceChildren();
    });
  }

  private async run(): Promise<void> {
    const query = this.input.value;
    if (!query) return;
    const say = (text: string) => this.results.replaceChildren(h("li", { class: "summary" }, text));
    say("Searching…");
    try {
      const { matches, truncated } = await this.files.search(query);
      if (matches.length === 0) return say(`No results for “${query}”.`);
      const files = new Set(matches.map((match) => match.path)).size;
      const count = `${matches.length}${truncated ? "+" : ""} result${matches.length === 1 ? "" : "s"} in ${files} file${files === 1 ? "" : "s"}`;
      this.results.replaceChildren(
        h("li", { class: "summary" }, count),
        ...matches.map((match) => {
          const button = h("button", { type: "button", title: `${match.path}:${match.line}` },
            h("span", { class: "where" }, `${match.path}:${match.line}`), match.text.trim());
          button.addEventListener("click", () => this.openAt(match.path, match.line));
          return h("li", { "data-path": match.path, "data-line": String(match.line) }, button);
        }),
      );
    } catch (error) {
      say(error instanceof ApiError ? error.message : String(error));
    }
  }
}
