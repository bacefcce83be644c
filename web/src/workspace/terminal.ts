/** An xterm.js terminal that fits its pane (shared by the run console and the shell). */
import { Terminal } from "@xterm/xterm";
import { FitAddon } from "@xterm/addon-fit";
import "@xterm/xterm/css/xterm.css";

const LIGHT = { background: "#ffffff", foreground: "#1d1d22", cursor: "#1d1d22", selectionBackground: "#b3d4fc" };
const DARK = { background: "#1e1e24", foreground: "#e8e8ee", cursor: "#e8e8ee", selectionBackground: "#3a4a6a" };

export class FittedTerminal {
  readonly terminal = new Terminal({ convertEol: true, fontSize: 13, fontFamily: "ui-monospace, monospace", scrollback: 5000 });
  private readonly fit = new FitAddon();
  private readonly observer: ResizeObserver;

  constructor(readonly parent: HTMLElement, dark: boolean) {
    this.terminal.loadAddon(this.fit);
    this.terminal.open(parent);
    this.setDark(dark);
    this.observer = new ResizeObserver(() => this.refit());
    this.observer.observe(parent);
    this.refit();
  }

  refit(): void {
    if (this.parent.offsetWidth > 0 && this.parent.offsetHeight > 0) this.fit.fit();
  }

  setDark(dark: boolean): void {
    this.terminal.options.theme = dark ? DARK : LIGHT;
  }

  destroy(): void {
    this.observer.disconnect();
    this.terminal.dispose();
  }
}

export function socketUrl(path: string): string {
  return `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}${path}`;
}
