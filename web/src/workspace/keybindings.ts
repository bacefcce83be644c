/** The editor's key bindings as chosen in Settings: CodeMirror's own, Vim or Emacs (Replit's packages,
 * loaded only when chosen, so that the workspace stays small for everyone else). */
import { Prec, type Extension } from "@codemirror/state";
import type { Command, EditorView } from "@codemirror/view";
import { yUndoManagerKeymap } from "y-codemirror.next";
import type { KeyBindings } from "../settings";

function yjsCommand(key: string): Command {
  return yUndoManagerKeymap.find((binding) => binding.key === key)!.run!;
}

let vimReady: Promise<Extension> | null = null;

async function loadVim(): Promise<Extension> {
  const { Vim, vim } = await import("@replit/codemirror-vim");
  // Vim's u and Ctrl-R would call CodeMirror's history, which collaborative editors don't keep: they undo with
  // the per-user Yjs undo manager instead, as Ctrl+Z does (only your own changes, never a partner's).
  // The undo manager selects what it brought back, which Vim would take for visual mode: the cursor goes to its start.
  const run = (key: string) => (cm: { cm6: EditorView }) => {
    yjsCommand(key)(cm.cm6);
    cm.cm6.dispatch({ selection: { anchor: cm.cm6.state.selection.main.from } });
  };
  Vim.defineAction("collabUndo", run("Mod-z"));
  Vim.defineAction("collabRedo", run("Mod-Shift-z"));
  Vim.mapCommand("u", "action", "collabUndo", {}, { context: "normal" });
  Vim.mapCommand("<C-r>", "action", "collabRedo", {}, { context: "normal" });
  return vim({ status: true });
}

/** Extensions for `keys`, at the highest precedence: a key they bind (Emacs' Ctrl+A, Vim's Ctrl+D) must reach them
 * before the default keymap (select all, ...), which the assistant's own highest-precedence keymap also lifts up. */
export async function keyBindings(keys: KeyBindings): Promise<Extension> {
  if (keys === "vim") return Prec.highest(await (vimReady ??= loadVim()));
  if (keys === "emacs") return Prec.highest((await import("@replit/codemirror-emacs")).emacs());
  return [];
}
