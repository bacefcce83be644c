/** Picks the CodeMirror language for a file name (plain text when unknown). */
import type { Extension } from "@codemirror/state";
import { python } from "@codemirror/lang-python";
import { javascript } from "@codemirror/lang-javascript";
import { html } from "@codemirror/lang-html";
import { css } from "@codemirror/lang-css";
import { json } from "@codemirror/lang-json";
import { markdown } from "@codemirror/lang-markdown";
import { cpp } from "@codemirror/lang-cpp";

const BY_EXTENSION: Record<string, () => Extension> = {
  py: () => python(),
  js: () => javascript(),
  mjs: () => javascript(),
  jsx: () => javascript({ jsx: true }),
  ts: () => javascript({ typescript: true }),
  tsx: () => javascript({ typescript: true, jsx: true }),
  html: () => html(),
  htm: () => html(),
  css: () => css(),
  json: () => json(),
  md: () => markdown(),
  c: () => cpp(),
  h: () => cpp(),
  cc: () => cpp(),
  cpp: () => cpp(),
  hpp: () => cpp(),
};

export function languageFor(path: string): Extension {
  const extension = path.includes(".") ? path.split(".").pop()!.toLowerCase() : "";
  return BY_EXTENSION[extension]?.() ?? [];
}
