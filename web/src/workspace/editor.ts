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
import { bracketMatching, foldGutter, foldKeymap, indentOnInput, indentUnit, syntaxHighlighting, defaultHighlightStyle } from "@codemirror/language";
import { highlightSelectionMatches, search, searchKeymap } from "@codemirror/search";
import { oneDark } from "@codemirror/theme-one-dark";
import * as Y from "yjs";
import { WebsocketProvider } from "y-websocket";
import { Awareness } from "y-protocols/awareness";
import { send } from "../api";
import { encodePath } from "./files";
import { yCollab, yUndoManagerKeymap } from "y-codemirror.next";
import { languageFor } from "./languages";
import { colorFor } from "./colors";
import { editorSettings, indentText, type EditorSettings, type KeyBindings } from "../settings";
import { keyBindings } from "./keybindings";

export type Connection = "connecting" | "synced" | "offline" | "denied" | "snapshot";

export interface EditorOptions {
  projectId: string;
  path: string;
  username: string;
  readOnly: boolean;
  /** false for visitors of a public project: they see the saved file, not the live room. */
  live: boolean;
  dark: boolean;
  /** Extra editor extensions (keyboard shortcuts of the workspace; later the assistant's ghost text). */
  extensions: Extension[];
  onConnection: (state: Connection, detail: string) => void;
}

const themeCompartment = new Compartment();
const keysCompartment = new Compartment();
const preferencesCompartment = new Compartment();

/** Indentation and font size as chosen in Settings. */
function preferences(settings: EditorSettings): Extension {
  return [
    EditorState.tabSize.of(settings.indent || 4),
    indentUnit.of(indentText(settings)),
    EditorView.theme({ "&": { fontSize: `${settings.fontSize}px` } }),
  ];
}

function collabUrl(projectId: string): string {
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  return `${scheme}://${location.host}/ws/collab/${encodeURIComponent(projectId)}`;
}

/** The editor, its document and its connection; `destroy` closes all three. */
export class FileEditor {
  readonly view: EditorView;
  readonly doc = new Y.Doc();
  readonly provider: WebsocketProvider | null = null;
  readonly undoManager: Y.UndoManager;
  private keys: KeyBindings | null = "default"; // null once destroyed

  constructor(readonly options: EditorOptions, parent: HTMLElement) {
    const ytext = this.doc.getText("content");
    this.undoManager = new Y.UndoManager(ytext);
    let awareness: Awareness;
    if (options.live) {
      this.provider = new WebsocketProvider(collabUrl(options.projectId), encodePath(options.path), this.doc, { maxBackoffTime: 2500 });
      awareness = this.provider.awareness;
      const color = colorFor(options.username);
      awareness.setLocalStateField("user", { name: options.username, color, colorLight: `${color}33` });
      this.watchConnection(this.provider);
    } else {
      awareness = new Awareness(this.doc);
      void this.loadSnapshot(ytext);
    }
    const settings = editorSettings();
    this.view = new EditorView({
      parent,
      state: EditorState.create({
        doc: ytext.toString(),
        extensions: [
          keysCompartment.of([]),
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
          preferencesCompartment.of(preferences(settings)),
          EditorState.readOnly.of(options.readOnly),
          EditorView.contentAttributes.of({ "aria-label": `Contents of ${options.path}` }),
          options.extensions,
          search({ top: true }),
          highlightSelectionMatches(),
          keymap.of([...yUndoManagerKeymap, ...defaultKeymap, ...searchKeymap, ...foldKeymap, indentWithTab]),
          languageFor(options.path),
          themeCompartment.of(options.dark ? oneDark : []),
          yCollab(ytext, awareness, { undoManager: this.undoManager }),
        ],
      }),
    });
    if (settings.keys !== "default") void this.applySettings(settings);
  }

  /** Follows the Settings page: indentation and font size at once, Vim or Emacs once their package has loaded. */
  async applySettings(settings: EditorSettings): Promise<void> {
    if (this.keys === null) return;
    this.view.dispatch({ effects: preferencesCompartment.reconfigure(preferences(settings)) });
    this.keys = settings.keys;
    const bindings = await keyBindings(settings.keys);
    if (this.keys !== settings.keys) return; // changed again while the package loaded
    this.view.dispatch({ effects: keysCompartment.reconfigure(bindings) });
    this.view.dom.dataset.keys = settings.keys; // which bindings are live (the tests wait for it)
  }

  /** Put the cursor at the start of `line` (1-based) and scroll to it, once the text has arrived (up to 3 s). */
  goToLine(line: number, deadline = Date.now() + 3000): void {
    const doc = this.view.state.doc;
    if (doc.lines < line && Date.now() < deadline) {
      setTimeout(() => this.goToLine(line, deadline), 50);
      return;
    }
    const target = doc.line(Math.min(Math.max(line, 1), doc.lines));
    this.view.dispatch({ selection: { anchor: target.from, head: target.to }, scrollIntoView: true });
    this.view.focus();
  }

  setDark(dark: boolean): void {
    this.view.dispatch({ effects: themeCompartment.reconfigure(dark ? oneDark : []) });
  }

  /** The connection state as the status line shows it. */
  connection(): Connection {
    const provider = this.provider;
    if (!provider) return "snapshot";
    if (provider.wsconnected) return provider.synced ? "synced" : "connecting";
    return provider.shouldConnect ? "offline" : "denied";
  }

  private async loadSnapshot(ytext: Y.Text): Promise<void> {
    try {
      const response = await send("GET", `/api/projects/${encodeURIComponent(this.options.projectId)}/files/content/${encodePath(this.options.path)}`);
      ytext.insert(0, await response.text());
      this.options.onConnection("snapshot", "");
    } catch (error) {
      this.options.onConnection("denied", (error as Error).message);
    }
  }

  private watchConnection(provider: WebsocketProvider): void {
    const report = this.options.onConnection;
    let denied = false;
    provider.on("status", ({ status }: { status: string }) => {
      if (denied) return;
      if (status === "connected") report(provider.synced ? "synced" : "connecting", "");
      else if (status === "connecting") report("connecting", "");
      else report("offline", "");
    });
    provider.on("sync", (synced: boolean) => {
      if (synced && !denied) report("synced", "");
    });
    provider.on("connection-close", (event: CloseEvent | null) => {
      if (event?.code === 4401 || event?.code === 4403) {
        denied = true;
        provider.shouldConnect = false;
        report("denied", event.code === 4401 ? "Your session has ended. Please sign in again." : event.reason || "You don't have access to this file.");
      } else if (!denied) {
        report("offline", "");
      }
    });
  }

  destroy(): void {
    this.keys = null;
    this.view.destroy();
    this.provider?.destroy();
    this.undoManager.destroy();
    this.doc.destroy();
  }
}
