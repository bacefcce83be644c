/** Codeyard's icon set: inline SVG (24×24, drawn with the text colour) so buttons need no image requests
 * and follow the theme; and the file-type badges of the tree. */

const PATHS = {
  run: '<path d="M7 4.5v15l12.5-7.5z" fill="currentColor"/>',
  stop: '<rect x="6" y="6" width="12" height="12" rx="1.5" fill="currentColor"/>',
  back: '<path d="M19 12H5M11 6l-6 6 6 6"/>',
  file: '<path d="M14 3H7a2 2 0 0 0-2 2v14a2 2 0 0 0 2 2h10a2 2 0 0 0 2-2V8z"/><path d="M14 3v5h5"/>',
  newFile: '<path d="M14 3H7a2 2 0 0 0-2 2v14a2 2 0 0 0 2 2h10a2 2 0 0 0 2-2V8z"/><path d="M14 3v5h5M12 11v6M9 14h6"/>',
  folder: '<path d="M3 7a2 2 0 0 1 2-2h4l2 2h8a2 2 0 0 1 2 2v8a2 2 0 0 1-2 2H5a2 2 0 0 1-2-2z"/>',
  folderOpen: '<path d="M3 18V7a2 2 0 0 1 2-2h4l2 2h6a2 2 0 0 1 2 2v2"/><path d="M3 18l2.6-7H22l-2.6 7z"/>',
  newFolder: '<path d="M3 7a2 2 0 0 1 2-2h4l2 2h8a2 2 0 0 1 2 2v8a2 2 0 0 1-2 2H5a2 2 0 0 1-2-2z"/><path d="M12 10v6M9 13h6"/>',
  upload: '<path d="M12 16V5M7 10l5-5 5 5M5 20h14"/>',
  download: '<path d="M12 4v11M7 10l5 5 5-5M5 20h14"/>',
  rename: '<path d="M4 20h4L19 9l-4-4L4 16z"/><path d="M13.5 6.5l4 4"/>',
  delete: '<path d="M4 7h16M10 11v6M14 11v6M6 7l1 13h10l1-13M9 7V4h6v3"/>',
  search: '<circle cx="11" cy="11" r="7"/><path d="M20 20l-4-4"/>',
  history: '<path d="M3.5 12a8.5 8.5 0 1 0 2.6-6.1L3.5 8.5"/><path d="M3.5 3.5v5h5M12 7.5V12l3 2"/>',
  settings: '<path d="M4 6h9M17 6h3M4 12h3M11 12h9M4 18h11M19 18h1"/><circle cx="15" cy="6" r="2"/><circle cx="9" cy="12" r="2"/><circle cx="17" cy="18" r="2"/>',
  assistant: '<path d="M11 3l1.9 5.1L18 10l-5.1 1.9L11 17l-1.9-5.1L4 10l5.1-1.9z"/><path d="M18.5 15l.9 2.1 2.1.9-2.1.9-.9 2.1-.9-2.1-2.1-.9 2.1-.9z"/>',
  share: '<circle cx="18" cy="5.5" r="2.5"/><circle cx="6" cy="12" r="2.5"/><circle cx="18" cy="18.5" r="2.5"/><path d="M8.2 10.8l7.6-4.1M8.2 13.2l7.6 4.1"/>',
  theme: '<circle cx="12" cy="12" r="8.5"/><path d="M12 3.5a8.5 8.5 0 0 1 0 17z" fill="currentColor"/>',
  deploy: '<path d="M7 18a4.5 4.5 0 1 1 .9-8.9A6 6 0 0 1 19.3 11 3.5 3.5 0 0 1 18 18"/><path d="M12 20v-7M9 15.5l3-3 3 3"/>',
  console: '<rect x="3" y="4.5" width="18" height="15" rx="2"/><path d="M7 9.5l3 2.5-3 2.5M12.5 15H17"/>',
  signOut: '<path d="M10 4H6a2 2 0 0 0-2 2v12a2 2 0 0 0 2 2h4M15 8l4 4-4 4M19 12H9"/>',
  plus: '<path d="M12 5v14M5 12h14"/>',
  people: '<circle cx="9" cy="8" r="3.5"/><path d="M2.5 20a6.5 6.5 0 0 1 13 0M16 4.6a3.5 3.5 0 0 1 0 6.8M18 14a6.5 6.5 0 0 1 3.5 6"/>',
  book: '<path d="M4 19V5a2 2 0 0 1 2-2h14v14H6a2 2 0 0 0 0 4h14"/><path d="M9 7h7"/>',
  logo: '<rect x="1.5" y="1.5" width="21" height="21" rx="5" fill="#2b6cb0" stroke="none"/><path d="M10 8l-4 4 4 4M14 8l4 4-4 4" stroke="#fff"/>',
} as const;

export type IconName = keyof typeof PATHS;

/** An icon for a button or link; hidden from screen readers (the button's text or label names it). */
export function icon(name: IconName): SVGSVGElement {
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  for (const [key, value] of Object.entries({ viewBox: "0 0 24 24", fill: "none", stroke: "currentColor", "stroke-width": "2",
    "stroke-linecap": "round", "stroke-linejoin": "round", "aria-hidden": "true", class: `icon-svg icon-${name}` })) {
    svg.setAttribute(key, value);
  }
  svg.innerHTML = PATHS[name]; // our own constant markup, never user text
  return svg;
}

/** `element` with `name`'s icon before its text. */
export function withIcon<T extends HTMLElement>(element: T, name: IconName): T {
  element.classList.add("with-icon");
  element.prepend(icon(name));
  return element;
}

/** File types by extension: the badge's letters; its colour comes from style.css by the type's name. */
const FILE_TYPES: Record<string, [type: string, letters: string]> = {
  py: ["python", "py"], pyi: ["python", "py"], ipynb: ["python", "nb"],
  js: ["javascript", "JS"], mjs: ["javascript", "JS"], cjs: ["javascript", "JS"], jsx: ["javascript", "JSX"],
  ts: ["typescript", "TS"], tsx: ["typescript", "TSX"],
  html: ["html", "<>"], htm: ["html", "<>"], css: ["css", "#"], scss: ["css", "#"],
  md: ["markdown", "M↓"], json: ["json", "{}"], toml: ["config", "⚙"], yaml: ["config", "⚙"], yml: ["config", "⚙"], ini: ["config", "⚙"], cfg: ["config", "⚙"],
  txt: ["text", "≡"], csv: ["data", "▦"], tsv: ["data", "▦"],
  c: ["c", "C"], h: ["c", "H"], cc: ["c", "C++"], cpp: ["c", "C++"], hpp: ["c", "H++"],
  sh: ["shell", "$"], bash: ["shell", "$"], go: ["go", "Go"], rs: ["rust", "Rs"], rb: ["ruby", "Rb"], java: ["java", "J"],
  png: ["image", "▣"], jpg: ["image", "▣"], jpeg: ["image", "▣"], gif: ["image", "▣"], svg: ["image", "▣"], webp: ["image", "▣"],
};

/** The tree's icon for a file: a small coloured badge whose letters are drawn by CSS, so they stay out of the
 * item's text (what tests, copy and screen readers see is the file name alone). */
export function fileIcon(path: string): Element {
  const name = path.split("/").pop() ?? path;
  const extension = name.includes(".") ? name.split(".").pop()!.toLowerCase() : "";
  const known = FILE_TYPES[extension] ?? (name === "Dockerfile" || name === "Makefile" ? ["config", "⚙"] : null);
  if (!known) return icon("file");
  const [type, letters] = known;
  const badge = document.createElement("span");
  badge.className = "file-icon";
  badge.dataset.type = type;
  badge.dataset.letters = letters;
  badge.setAttribute("aria-hidden", "true");
  return badge;
}
