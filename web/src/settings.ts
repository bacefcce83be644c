/** Editor preferences, kept per browser (like the theme): indentation, font size, key bindings and theme. */

export type KeyBindings = "default" | "vim" | "emacs";

export interface EditorSettings {
  indent: number; // spaces per indentation level; 0 indents with a tab
  fontSize: number; // pixels
  keys: KeyBindings;
  theme: "system" | "light" | "dark";
}

const KEY = "codeyard-editor";
const THEME_KEY = "codeyard-theme"; // the workspace's ◐ button writes it too
const KEY_BINDINGS: KeyBindings[] = ["default", "vim", "emacs"];
export const DEFAULTS: EditorSettings = { indent: 4, fontSize: 14, keys: "default", theme: "system" };

export function editorSettings(): EditorSettings {
  let saved: Partial<EditorSettings> = {};
  try {
    saved = JSON.parse(localStorage.getItem(KEY) ?? "{}") as Partial<EditorSettings>;
  } catch {
    // a hand-edited value: the defaults
  }
  const theme = localStorage.getItem(THEME_KEY);
  return {
    indent: [0, 2, 4, 8].includes(saved.indent ?? -1) ? (saved.indent as number) : DEFAULTS.indent,
    fontSize: Math.min(Math.max(Number(saved.fontSize) || DEFAULTS.fontSize, 10), 28),
    keys: KEY_BINDINGS.includes(saved.keys as KeyBindings) ? (saved.keys as KeyBindings) : DEFAULTS.keys,
    theme: theme === "light" || theme === "dark" ? theme : "system",
  };
}

export function saveEditorSettings(settings: EditorSettings): void {
  localStorage.setItem(KEY, JSON.stringify({ indent: settings.indent, fontSize: settings.fontSize, keys: settings.keys }));
  if (settings.theme === "system") localStorage.removeItem(THEME_KEY);
  else localStorage.setItem(THEME_KEY, settings.theme);
}

/** Calls `changed` when the settings are saved in another tab (the Settings page), so open editors follow at once. */
export function onEditorSettingsSaved(changed: (settings: EditorSettings) => void): void {
  window.addEventListener("storage", (event) => {
    if (event.key === KEY || event.key === THEME_KEY || event.key === null) changed(editorSettings());
  });
}

/** The text one indentation level inserts. */
export function indentText(settings: EditorSettings): string {
  return settings.indent === 0 ? "\t" : " ".repeat(settings.indent);
}
