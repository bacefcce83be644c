/** Lesson text as DOM: paragraphs, lists, fenced code, `code`, **bold** and *italics*.
 * Built with text nodes only (never innerHTML), so a lesson can't inject markup. */
import { h } from "../dom";

function inline(text: string): (Node | string)[] {
  const parts: (Node | string)[] = [];
  const pattern = /`([^`]+)`|\*\*([^*]+)\*\*|\*([^*]+)\*/g;
  let last = 0;
  for (const match of text.matchAll(pattern)) {
    parts.push(text.slice(last, match.index));
    if (match[1] !== undefined) parts.push(h("code", {}, match[1]));
    else if (match[2] !== undefined) parts.push(h("strong", {}, match[2]));
    else parts.push(h("em", {}, match[3]));
    last = (match.index ?? 0) + match[0].length;
  }
  parts.push(text.slice(last));
  return parts;
}

export function renderMarkdown(source: string): HTMLElement {
  const root = h("div", { class: "markdown" });
  const lines = source.replace(/\r\n/g, "\n").split("\n");
  let list: HTMLElement | null = null;
  let paragraph: string[] = [];
  const flush = () => {
    if (paragraph.length) root.append(h("p", {}, ...inline(paragraph.join(" "))));
    paragraph = [];
  };
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    const fence = line.match(/^(`{3,}|~{3,})/);
    if (fence) {
      flush();
      list = null;
      const body: string[] = [];
      for (i++; i < lines.length && !lines[i].startsWith(fence[1]); i++) body.push(lines[i]);
      root.append(h("pre", {}, h("code", {}, body.join("\n"))));
      continue;
    }
    const item = line.match(/^\s*(?:[-*]|\d+\.)\s+(.*)$/);
    if (item) {
      flush();
      const ordered = /^\s*\d+\./.test(line);
      if (!list || (list.tagName === "OL") !== ordered) root.append((list = h(ordered ? "ol" : "ul", {})));
      list.append(h("li", {}, ...inline(item[1])));
    } else if (!line.trim()) {
      flush();
      list = null;
    } else if (/^#{1,6}\s/.test(line)) {
      flush();
      list = null;
      root.append(h("h4", {}, ...inline(line.replace(/^#+\s*/, ""))));
    } else if (list && /^\s+/.test(line)) {
      list.lastElementChild?.append(" ", ...inline(line.trim()));
    } else {
      list = null;
      paragraph.push(line.trim());
    }
  }
  flush();
  return root;
}
