/** The Shell pane: a terminal on the project's sandbox PTY (/ws/projects/{id}/shell). */
import { FittedTerminal, socketUrl } from "./terminal";

export class ShellPane {
  readonly term: FittedTerminal;
  private socket: WebSocket | null = null;
  /** Keys typed before the socket opened, sent once it does. */
  private pending: string[] = [];

  constructor(parent: HTMLElement, dark: boolean, private readonly projectId: string) {
    this.term = new FittedTerminal(parent, dark);
    this.term.terminal.onData((data) => this.send({ type: "input", data }));
    this.term.terminal.onResize(({ rows, cols }) => this.send({ type: "resize", rows, cols }));
  }

  connect(): void {
    if (this.socket) return;
    const { rows, cols } = this.term.terminal;
    const terminal = this.term.terminal;
    terminal.writeln("\x1b[2mStarting a shell in the sandbox…\x1b[0m");
    const socket = new WebSocket(socketUrl(`/ws/projects/${encodeURIComponent(this.projectId)}/shell?rows=${rows}&cols=${cols}`));
    this.socket = socket;
    socket.onopen = () => {
      for (const frame of this.pending) socket.send(frame);
      this.pending = [];
    };
    socket.onmessage = (event) => {
      const frame = JSON.parse(String(event.data)) as { type: string; data?: string; message?: string };
      if (frame.type === "output") terminal.write(frame.data ?? "");
      else if (frame.type === "error") terminal.writeln(`\x1b[33m${frame.message ?? ""}\x1b[0m`);
      else if (frame.type === "exit") terminal.writeln("\r\n\x1b[2mThe shell ended. Open the Shell tab again for a new one.\x1b[0m");
    };
    socket.onclose = (event) => {
      this.socket = null;
      if (event.code === 4403) terminal.writeln(`\x1b[33mThe shell is not available: ${event.reason || "only editors can open it"}.\x1b[0m`);
      else if (event.code === 4503) terminal.writeln(`\x1b[33mThe sandbox is not available on this server: ${event.reason}.\x1b[0m`);
    };
  }

  private send(frame: object): void {
    if (this.socket?.readyState === WebSocket.OPEN) this.socket.send(JSON.stringify(frame));
    else if (this.socket?.readyState === WebSocket.CONNECTING) this.pending.push(JSON.stringify(frame));
  }
}
