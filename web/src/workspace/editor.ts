/** One collaborative editor per open file: a Y.Doc synced over /ws/collab, shown in CodeMirror. */
import { Compartment, EditorState, type Extension } from "@codemirror/state";
import {
  EditorView,
  crosshairCursor,
  drawSelection,
  dropCursor,
  highlightActiveLine,
  highlightActiveLineGutter,
  highlightSpecialChars,
  keymap,
  lineNumbers,
  rectangularSelection,
} from "@codemirror/view";
import { defaultKeymap, indentWithTab } from "@codemirror/commands";
import { bracketMatching, foldGutter, foldKeymap, indentOnInput, syntaxHighlighting, defaultHighlightStyle } from "@codemirror/language";
import { oneDark } from "@codemirror/theme-one-dark";
import * as Y from "yjs";
import { WebsocketProvider } from "y-websocket";
import { yCollab, yUndoManagerKeymap } from "y-codemirror.next";
import { languageFor } from "./languages";
import { colorFor } from "./colors";

export type Connection = "connecting" | "synced" | "offline" | "denied";

export interface EditorOptions {
  projectId: string;
  path: string;
  username: string;
  readOnly: boolean;
  dark: boolean;
  /** Extra editor extensions (keyboard shortcuts of the workspace; later the assistant's ghost text). */
  extensions: Extension[];
  onConnection: (state: Connection, detail: string) => void;
}

const themeCompartment = new Compartment();

function collabUrl(projectId: string): string {
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  return `${scheme}://${location.host}/ws/collab/${encodeURIComponent(projectId)}`;
}

/** The editor, its document and its connection; `destroy` closes all three. */
export class FileEditor {
  readonly view: EditorView;
  readonly doc = new Y.Doc();
  readonly provider: WebsocketProvider;
  readonly undoManager: Y.UndoManager;

  constructor(readonly options: EditorOptions, parent: HTMLElement) {
    const room = options.path.split("/").map(encodeURIComponent).join("/");
    this.provider = new WebsocketProvider(collabUrl(options.projectId), room, this.doc, { maxBackoffTime: 2500 });
    const ytext = this.doc.getText("content");
    this.undoManager = new Y.UndoManager(ytext);
    const color = colorFor(options.username);
    this.provider.awareness.setLocalStateField("user", { name: options.username, color, colorLight: `${color}33` });
    this.watchConnection();
    this.view = new EditorView({
      parent,
      state: EditorState.create({
        doc: ytext.toString(),
        extensions: [
          lineNumbers(),
          highlightActiveLineGutter(),
          highlightSpecialChars(),
          foldGutter(),
          drawSelection(),
          dropCursor(),
          indentOnInput(),
          syntaxHighlighting(defaultHighlightStyle, { fallback: true }),
          bracketMatching(),
          rectangularSelection(),
          crosshairCursor(),
          highlightActiveLine(),
          EditorState.tabSize.of(4),
          EditorState.readOnly.of(options.readOnly),
          EditorView.contentAttributes.of({ "aria-label": `Contents of ${options.path}` }),
          options.extensions,
          keymap.of([...yUndoManagerKeymap, ...defaultKeymap, ...foldKeymap, indentWithTab]),
          languageFor(options.path),
          themeCompartment.of(options.dark ? oneDark : []),
          yCollab(ytext, this.provider.awareness, { undoManager: this.undoManager }),
        ],
      }),
    });
  }

  setDark(dark: boolean): void {
    this.view.dispatch({ effects: themeCompartment.reconfigure(dark ? oneDark : []) });
  }

  private watchConnection(): void {
    const report = this.options.onConnection;
    let denied = false;
    this.provider.on("status", ({ status }: { status: string }) => {
      if (denied) return;
      if (status === "connected") report(this.provider.synced ? "synced" : "connecting", "");
      else if (status === "connecting") report("connecting", "");
      else report("offline", "");
    });
    this.provider.on("sync", (synced: boolean) => {
      if (synced && !denied) report("synced", "");
    });
    this.provider.on("connection-close", (event: CloseEvent | null) => {
      if (event?.code === 4401 || event?.code === 4403) {
        denied = true;
        this.provider.shouldConnect = false;
        report("denied", event.code === 4401 ? "Your session has ended. Please sign in again." : event.reason || "You don't have access to this file.");
      } else if (!denied) {
        report("offline", "");
      }
    });
  }

  destroy(): void {
    this.view.destroy();
    this.provider.destroy();
    this.undoManager.destroy();
    this.doc.destroy();
  }
}
