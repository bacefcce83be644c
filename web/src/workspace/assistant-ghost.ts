/** Inline ghost text in CodeMirror: after a pause in typing, the model's guess for the rest of the
 * line shows greyed at the cursor; Tab accepts it, Escape (or typing on) dismisses it. Typing on
 * also aborts the request in flight, which stops the generation on the server. */
import { Prec, StateEffect, StateField, type Extension } from "@codemirror/state";
import { Decoration, EditorView, ViewPlugin, WidgetType, keymap, type ViewUpdate } from "@codemirror/view";

export const GHOST_DELAY_MS = 350;

interface Ghost {
  pos: number;
  text: string;
}

/** What the ghost-text plugin asks of its owner: a completion for the cursor (null: none). */
export type Completer = (view: EditorView, signal: AbortSignal) => Promise<string | null>;

const setGhost = StateEffect.define<Ghost | null>();

class GhostWidget extends WidgetType {
  constructor(readonly text: string) {
    super();
  }

  eq(other: GhostWidget): boolean {
    return other.text === this.text;
  }

  toDOM(): HTMLElement {
    const span = document.createElement("span");
    span.className = "cm-ghost-text";
    span.setAttribute("aria-label", `Suggestion: ${this.text} (Tab to accept)`);
    span.textContent = this.text;
    return span;
  }
}

const ghostField = StateField.define<Ghost | null>({
  create: () => null,
  update(ghost, tr) {
    for (const effect of tr.effects) if (effect.is(setGhost)) return effect.value;
    return tr.docChanged || tr.selection ? null : ghost;
  },
  provide: (field) =>
    EditorView.decorations.from(field, (ghost) =>
      ghost ? Decoration.set([Decoration.widget({ widget: new GhostWidget(ghost.text), side: 1 }).range(ghost.pos)]) : Decoration.none,
    ),
});

function accept(view: EditorView): boolean {
  const ghost = view.state.field(ghostField);
  if (!ghost) return false;
  const end = ghost.pos + ghost.text.length;
  view.dispatch({ changes: { from: ghost.pos, insert: ghost.text }, selection: { anchor: end }, userEvent: "input.complete" });
  return true;
}

function dismiss(view: EditorView): boolean {
  if (!view.state.field(ghostField)) return false;
  view.dispatch({ effects: setGhost.of(null) });
  return true;
}

/** Asks for a completion after each pause in typing; at most one request in flight per editor. */
function requester(complete: Completer) {
  return ViewPlugin.fromClass(
    class {
      private timer = 0;
      private inFlight: AbortController | null = null;

      constructor(private readonly view: EditorView) {}

      update(update: ViewUpdate): void {
        if (!update.transactions.some((tr) => tr.isUserEvent("input.type") || tr.isUserEvent("delete"))) return;
        this.cancel();
        if (update.transactions.some((tr) => tr.isUserEvent("input.type"))) {
          this.timer = window.setTimeout(() => void this.request(), GHOST_DELAY_MS);
        }
      }

      /** Also called by the owner when the model has loaded, to retry at the cursor. */
      async request(): Promise<void> {
        const view = this.view;
        const selection = view.state.selection.main;
        if (!selection.empty) return;
        const doc = view.state.doc;
        const controller = new AbortController();
        this.inFlight = controller;
        try {
          const text = await complete(view, controller.signal);
          if (text && view.state.doc === doc && view.state.selection.main.head === selection.head) {
            view.dispatch({ effects: setGhost.of({ pos: selection.head, text }) });
          }
        } catch (error) {
          if (!controller.signal.aborted) throw error;
        } finally {
          if (this.inFlight === controller) this.inFlight = null;
        }
      }

      cancel(): void {
        window.clearTimeout(this.timer);
        this.inFlight?.abort();
        this.inFlight = null;
      }

      destroy(): void {
        this.cancel();
      }
    },
  );
}

/** The editor extension, and a way to ask again at the cursor (once the model is ready). */
export function ghostText(complete: Completer): { extension: Extension; retry: (view: EditorView) => void } {
  const plugin = requester(complete);
  return {
    extension: [
      ghostField,
      plugin,
      Prec.highest(keymap.of([{ key: "Tab", run: accept }, { key: "Escape", run: dismiss }])),
    ],
    retry: (view) => void view.plugin(plugin)?.request(),
  };
}
