/** The run console: starts a run, streams its output, passes typed lines to its stdin, shows the verdict.
 * Every member's console follows the project's latest run, whoever started it; viewers only watch. */
import { api, ApiError } from "../api";
import { FittedTerminal, socketUrl } from "./terminal";

interface Run {
  id: string;
}

/** The events socket's word that someone started a run of the project. */
export interface RunStarted {
  id: string;
  username: string;
  argv: string[];
  interactive: boolean;
}

interface ExitFrame {
  verdict: string | null;
  exit_code: number | null;
  cpu_seconds: number | null;
  wall_seconds: number | null;
  peak_memory_bytes: number | null;
  message: string;
}

/** How much of a run's output "Explain this error" gets (its end, where the error is). */
const KEPT_OUTPUT_CHARS = 20000;

const VERDICTS: Record<string, string> = {
  ok: "Finished",
  runtime_error: "Runtime error",
  time_limit: "Time limit exceeded",
  memory_limit: "Memory limit exceeded",
  output_limit: "Too much output",
  cancelled: "Stopped",
};

/** A run's state while it waits for a slot or runs (runs start round-robin between users). */
interface StatusFrame {
  status: "queued" | "running";
  queue_position: number | null;
  waiting_for_input: boolean;
  listening_port: number | null;
  preview_url: string | null; // where the Webview opens the page the program serves
}

function describeStatus(frame: StatusFrame): string {
  if (frame.status === "queued") return `Queued (position ${frame.queue_position ?? "?"})`;
  if (frame.waiting_for_input) return "Waiting for input…";
  return frame.listening_port !== null ? `Serving on port ${frame.listening_port}` : "Running…";
}

const INTERACTIVE_NOTE =
  "The clock stops while the program waits for input (up to 10 min each time). Ctrl+D ends the input; Stop or Ctrl+C stops the program.";

function describeExit(frame: ExitFrame): string {
  const verdict = VERDICTS[frame.verdict ?? ""] ?? frame.verdict ?? "Finished";
  const parts = [verdict];
  if (frame.exit_code !== null && frame.exit_code !== 0) parts.push(`exit code ${frame.exit_code}`);
  if (frame.wall_seconds !== null) parts.push(`${frame.wall_seconds.toFixed(2)} s`);
  if (frame.cpu_seconds !== null) parts.push(`CPU ${frame.cpu_seconds.toFixed(2)} s`);
  if (frame.peak_memory_bytes) parts.push(`${(frame.peak_memory_bytes / 1048576).toFixed(1)} MB`);
  return parts.join(" · ");
}

export class RunConsole {
  readonly term: FittedTerminal;
  private socket: WebSocket | null = null;
  private runId: string | null = null;
  private line = "";
  private starting = false;
  private output = "";
  private owner: string | null = null; // who started the followed run, when not this user

  /** onState's failedOutput: the output of a run that failed (null while running, or after a success). */
  constructor(
    parent: HTMLElement,
    dark: boolean,
    private readonly projectId: string,
    private readonly me: string,
    private readonly canWrite: boolean,
    private readonly onState: (running: boolean, summary: string, failedOutput: string | null) => void,
    private readonly onServe: (url: string | null, port: number | null) => void = () => undefined,
  ) {
    this.term = new FittedTerminal(parent, dark);
    this.term.terminal.writeln(
      canWrite
        ? "Press Run (Ctrl+Enter) to run your program. Type here when it asks for input; Stop or Ctrl+C stops it."
        : "Runs of this project show here as they happen.",
    );
    this.term.terminal.onData((data) => this.typed(data));
  }

  get running(): boolean {
    return this.starting || this.socket !== null;
  }

  async start(entry: string | null): Promise<void> {
    if (this.running) return;
    const terminal = this.term.terminal;
    terminal.reset();
    terminal.writeln(`\x1b[2m▶ Running ${entry ?? "the project"}…\x1b[0m`);
    this.owner = null;
    this.onState(true, "Running…", null);
    let run: Run;
    this.starting = true;
    try {
      run = await api<Run>("POST", `/api/projects/${encodeURIComponent(this.projectId)}/runs`, { ...(entry ? { entry } : {}), interactive: true });
    } catch (error) {
      const message = error instanceof ApiError ? error.message : String(error);
      terminal.writeln(`\x1b[31mCould not start the program: ${message}\x1b[0m`);
      this.onState(false, "Could not start", null);
      return;
    } finally {
      this.starting = false;
    }
    terminal.writeln(`\x1b[2m${INTERACTIVE_NOTE}\x1b[0m`);
    this.follow(run.id);
  }

  /** Follow a run someone else started (or this user in another tab); one's own start follows its run itself. */
  watch(run: RunStarted): void {
    if (run.id === this.runId || (this.starting && run.username === this.me)) return;
    const terminal = this.term.terminal;
    terminal.reset();
    const command = run.argv.join(" ");
    const who = run.username === this.me ? "You are" : `${run.username} is`;
    terminal.writeln(`\x1b[2m▶ ${who} running ${command}${this.canWrite ? " — you can type its input here too" : ""}\x1b[0m`);
    if (run.interactive && this.canWrite) terminal.writeln(`\x1b[2m${INTERACTIVE_NOTE}\x1b[0m`);
    this.owner = run.username === this.me ? null : run.username;
    this.onState(true, `${this.owner ? `${this.owner}: ` : ""}Running…`, null);
    this.follow(run.id);
  }

  async stop(): Promise<void> {
    if (this.runId) await api("POST", `/api/runs/${encodeURIComponent(this.runId)}/cancel`).catch(() => undefined);
  }

  private follow(runId: string): void {
    const terminal = this.term.terminal;
    const previous = this.socket;
    if (previous) {
      previous.onclose = previous.onmessage = null; // a newer run takes the console over
      previous.close();
    }
    const socket = new WebSocket(socketUrl(`/ws/runs/${encodeURIComponent(runId)}`));
    this.socket = socket;
    this.runId = runId;
    this.line = "";
    this.output = "";
    let finished = false;
    socket.onmessage = (event) => {
      const frame = JSON.parse(String(event.data)) as { type: string; data?: string; message?: string } & ExitFrame & StatusFrame;
      if (frame.type === "stdout" || frame.type === "stderr") this.output = (this.output + (frame.data ?? "")).slice(-KEPT_OUTPUT_CHARS);
      if (frame.type === "stdout") terminal.write(frame.data ?? "");
      else if (frame.type === "stderr") terminal.write(`\x1b[31m${frame.data ?? ""}\x1b[0m`);
      else if (frame.type === "install") terminal.write(`\x1b[36m${frame.data ?? ""}\x1b[0m`);
      else if (frame.type === "error") terminal.writeln(`\x1b[33m${frame.message ?? ""}\x1b[0m`);
      else if (frame.type === "status") {
        this.onState(true, `${this.owner ? `${this.owner}: ` : ""}${describeStatus(frame)}`, null);
        this.onServe(frame.preview_url, frame.listening_port);
      } else if (frame.type === "exit") {
        finished = true;
        this.onServe(null, null);
        const summary = describeExit(frame);
        terminal.writeln("");
        terminal.writeln(`\x1b[1m■ ${summary}\x1b[0m${frame.message ? ` — ${frame.message}` : ""}`);
        const failed = frame.verdict !== null && frame.verdict !== "ok" && frame.verdict !== "cancelled";
        this.onState(false, summary, failed ? `${this.output}${frame.message ? `\n${frame.message}` : ""}` || summary : null);
      }
    };
    socket.onclose = (event) => {
      if (this.socket !== socket) return;
      this.socket = null;
      this.runId = null;
      if (!finished) {
        const reason = event.code === 4401 ? "your session has ended; sign in again" : event.reason || "the connection to the server was lost";
        terminal.writeln(`\x1b[33mThe run's output stopped: ${reason}.\x1b[0m`);
        this.onState(false, "Disconnected", null);
      }
    };
  }

  /** Line editing with local echo: the program reads whole lines, as in a terminal in cooked mode. */
  private typed(data: string): void {
    const socket = this.socket;
    if (!this.canWrite || !socket || socket.readyState !== WebSocket.OPEN) return;
    const terminal = this.term.terminal;
    for (const char of data) {
      if (char === "\r" || char === "\n") {
        terminal.write("\r\n");
        socket.send(JSON.stringify({ type: "stdin", data: `${this.line}\n` }));
        this.line = "";
      } else if (char === "\x7f" || char === "\b") {
        if (this.line) {
          this.line = this.line.slice(0, -1);
          terminal.write("\b \b");
        }
      } else if (char === "\x04") {
        if (this.line) socket.send(JSON.stringify({ type: "stdin", data: this.line }));
        this.line = "";
        socket.send(JSON.stringify({ type: "stdin_eof" }));
      } else if (char === "\x03") {
        void this.stop();
      } else if (char >= " ") {
        this.line += char;
        terminal.write(char);
      }
    }
  }
}
