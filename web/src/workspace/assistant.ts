/** The assistant in the workspace: ghost text in editors, "Explain this error" after a failed run,
 * a chat panel about the current file, the owner's on/off switch, and the model's status.
 *
 * Everything hides while the project's owner has switched it off (a 403 from any call means the
 * same); owners keep the panel button, to switch it back on. The server starts loading the model when
 * it starts (or, deferred, on the first call, which answers 503): while it loads, the status line says
 * how far it is (polled), and a question or "Explain" waits in the panel, then goes once it is ready. A pasted or
 * dropped image goes with the next question when the model sees images; a text-only model's panel says it cannot. */
import type { EditorView } from "@codemirror/view";
import { ApiError } from "../api";
import { h } from "../dom";
import { AssistantClient, type AssistantState, type ChatTurn, type FinishReason, type ModelStatus, type OpenFile } from "./assistant-client";
import { ghostText } from "./assistant-ghost";
import { Attachments, CANNOT_SEE, imageFiles, MAX_IMAGES, questionImages, readDataUrl, refusal } from "./assistant-images";
import { renderMarkdown } from "./lesson-markdown";

const POLL_MS = 2000;
const TRIES = 3; // a call that finds the model loading waits for it, then tries again (a few times at most)
const IMAGE_QUESTION = "What does this image show?"; // asked when an image is sent without words

const MODEL_TEXT: Record<ModelStatus["state"], (model: ModelStatus) => string> = {
  loading: (model) => `Assistant: model loading… ${model.progress ?? 0}%`,
  ready: () => "Assistant ready",
  failed: () => "Assistant unavailable",
  off: () => "Assistant unavailable",
  deferred: () => "Assistant: the model loads on first use",
};

/** Streams an answer (or, given the answer so far, the rest of it) to `onText`; resolves to why it ended. */
type Answerer = (soFar: string | null, onText: (text: string) => void, signal: AbortSignal) => Promise<FinishReason>;

/** The answer up to its last natural stop: the end of a line or a closed code block, or of the last sentence
 * (outside code); all of it when it has none. */
export function naturalEnd(text: string): string {
  let end = 0;
  let inCode = false;
  let offset = 0;
  const lines = text.split("\n");
  lines.forEach((line, index) => {
    if (line.trimStart().startsWith("```")) {
      inCode = !inCode;
      if (!inCode) end = offset + line.length;
    } else if (!inCode && index < lines.length - 1) {
      end = offset + line.length; // a finished line
    } else if (!inCode) {
      const sentence = /^.*[.!?:](?=\s|$)/.exec(line); // the last line: up to its last finished sentence
      if (sentence) end = offset + sentence[0].length;
    }
    offset += line.length + 1;
  });
  return end > 0 ? text.slice(0, end).trimEnd() : text;
}

/** What the assistant needs from the workspace. */
export interface AssistantContext {
  activePath(): string | null;
  /** Open files, the active one first. */
  openFiles(): OpenFile[];
}

export class AssistantUi {
  readonly button = h("button", { type: "button", class: "secondary", id: "assistant-button", hidden: "" }, "Assistant");
  readonly status = h("span", { class: "assistant-status", id: "assistant-status", role: "status" });
  readonly explainButton = h("button", { type: "button", class: "secondary", id: "explain-error", hidden: "" }, "Explain this error");
  readonly panel = h("aside", { class: "assistant-panel card", id: "assistant-panel", hidden: "", "aria-label": "Assistant" });
  private readonly client: AssistantClient;
  private readonly ghost;
  private readonly switch = h("input", { type: "checkbox", id: "assistant-enabled" });
  private readonly switchRow = h("label", { class: "inline", hidden: "" }, this.switch, "Assistant on for this project");
  private readonly offNote = h("p", { class: "status status-info", id: "assistant-off", hidden: "" }, "The assistant is switched off for this project.");
  private readonly messages = h("div", { class: "assistant-messages", id: "assistant-messages", "aria-live": "polite" });
  private readonly input = h("textarea", { id: "assistant-input", rows: "3", placeholder: "Ask about the current file…" });
  private readonly form = h("form", { class: "assistant-form" });
  private readonly attachments = new Attachments();
  private state: AssistantState | null = null;
  private conversation: ChatTurn[] = [];
  private failedOutput: string | null = null;
  private answering: AbortController | null = null;
  private polling = false;
  private waitingEditor: EditorView | null = null;
  private modelWaiters: ((model: ModelStatus) => void)[] = [];

  constructor(projectId: string, private readonly context: AssistantContext) {
    this.client = new AssistantClient(projectId);
    this.ghost = ghostText((view, signal) => this.complete(view, signal));
    this.button.addEventListener("click", () => this.toggle());
    this.explainButton.addEventListener("click", () => void this.explain());
    this.switch.addEventListener("change", () => void this.setEnabled(this.switch.checked));
    const close = h("button", { type: "button", class: "secondary", id: "assistant-close", "aria-label": "Close the assistant" }, "×");
    close.addEventListener("click", () => this.toggle(false));
    this.form.append(this.input, h("button", { type: "submit", id: "assistant-send" }, "Ask"));
    this.form.addEventListener("submit", (event) => {
      event.preventDefault();
      void this.ask();
    });
    this.input.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && !event.shiftKey) {
        event.preventDefault();
        void this.ask();
      }
    });
    this.input.addEventListener("paste", (event) => this.takeImages(event, event.clipboardData));
    this.panel.addEventListener("dragover", (event) => {
      if (this.enabled && event.dataTransfer?.types.includes("Files")) event.preventDefault(); // lets files drop here
    });
    this.panel.addEventListener("drop", (event) => this.takeImages(event, event.dataTransfer));
    this.panel.append(
      h("div", { class: "assistant-head" }, h("strong", {}, "Assistant"), close),
      this.switchRow,
      this.offNote,
      this.messages,
      this.attachments.strip,
      this.form,
    );
  }

  /** The editor extension for one file. */
  get extension() {
    return this.ghost.extension;
  }

  async start(): Promise<void> {
    try {
      this.apply(await this.client.state());
    } catch {
      this.apply(null);
    }
  }

  get enabled(): boolean {
    return this.state?.enabled ?? false;
  }

  /** Called by the run console: offer "Explain this error" after a failed run. */
  runEnded(failedOutput: string | null): void {
    this.failedOutput = failedOutput;
    this.explainButton.hidden = !this.enabled || failedOutput === null;
  }

  private apply(state: AssistantState | null): void {
    this.state = state;
    const on = state?.enabled ?? false;
    this.button.hidden = !on && !state?.can_change;
    this.switchRow.hidden = !state?.can_change;
    this.switch.checked = on;
    this.offNote.hidden = on;
    this.messages.hidden = !on;
    this.form.hidden = !on;
    if (!on) this.attachments.take();
    this.explainButton.hidden = !on || this.failedOutput === null;
    if (this.button.hidden) this.panel.hidden = true;
    if (state) this.modelChanged(state.model);
    else this.status.textContent = "";
  }

  private get model(): ModelStatus | null {
    return this.state?.model ?? null;
  }

  /** Shows the model's status; while it loads, watches it; once it settles, lets waiting calls go. */
  private modelChanged(model: ModelStatus): void {
    if (this.state) this.state = { ...this.state, model };
    this.status.textContent = this.enabled ? MODEL_TEXT[model.state](model) : "";
    this.status.title = model.detail;
    this.status.dataset.model = model.state;
    this.input.placeholder = model.sees_images === false ? "Ask about the current file…" : "Ask about the current file, or paste or drop an image…";
    this.explainButton.title = model.state === "loading" ? "The model is still loading: the answer comes once it is ready" : "";
    if (model.state === "loading") {
      void this.pollUntilReady();
    } else {
      for (const settled of this.modelWaiters.splice(0)) settled(model);
    }
  }

  /** The model's status once it is no longer loading. */
  private settledModel(): Promise<ModelStatus> {
    const model = this.model;
    if (model && model.state !== "loading") return Promise.resolve(model);
    return new Promise((resolve) => this.modelWaiters.push(resolve));
  }

  private toggle(open = this.panel.hidden): void {
    this.panel.hidden = !open;
    if (open && this.enabled) this.input.focus();
  }

  private async setEnabled(enabled: boolean): Promise<void> {
    try {
      this.apply(await this.client.setEnabled(enabled));
    } catch (error) {
      this.say(error instanceof ApiError ? error.message : String(error));
    }
  }

  /** Handles an error of a call: off (hide everything), or its message. */
  private failed(error: unknown): string {
    if (error instanceof ApiError && error.status === 403 && this.state) this.apply({ ...this.state, enabled: false });
    return error instanceof Error ? error.message : String(error);
  }

  /** Whether a call's error says the model is loading (a deferred model's first call starts the load); one
   * known to have failed (or be off) stays so, and the call's error says why. */
  private isLoading(error: unknown): boolean {
    const settled = this.model?.state === "failed" || this.model?.state === "off";
    if (!(error instanceof ApiError && error.status === 503) || settled) return false;
    this.modelChanged({ state: "loading", detail: error.message, progress: 0 });
    return true;
  }

  private async pollUntilReady(): Promise<void> {
    if (this.polling) return;
    this.polling = true;
    let model: ModelStatus | null = null;
    try {
      while (model === null || model.state === "loading") {
        await new Promise((resolve) => setTimeout(resolve, POLL_MS));
        model = await this.client.model().catch(() => null);
        if (model?.state === "loading") this.modelChanged(model); // its progress (polling goes on here)
      }
    } finally {
      this.polling = false;
    }
    this.modelChanged(model);
    const waiting = this.waitingEditor;
    this.waitingEditor = null;
    if (waiting && model.state === "ready") this.ghost.retry(waiting);
  }

  private async complete(view: EditorView, signal: AbortSignal): Promise<string | null> {
    const path = this.context.activePath();
    if (!this.enabled || !path) return null;
    const head = view.state.selection.main.head;
    const doc = view.state.doc;
    const others = this.context.openFiles().filter((file) => file.path !== path);
    if (this.model?.state === "loading") {
      this.waitingEditor = view; // asked again once the model is ready
      return null;
    }
    try {
      const text = await this.client.complete(path, doc.sliceString(0, head), doc.sliceString(head), others, signal);
      if (this.model?.state !== "ready") void this.client.model().then((model) => this.modelChanged(model), () => undefined);
      return text;
    } catch (error) {
      if (signal.aborted) throw error;
      if (this.isLoading(error)) this.waitingEditor = view;
      else this.status.textContent = `Assistant: ${this.failed(error)}`;
      return null;
    }
  }

  private async explain(): Promise<void> {
    const output = this.failedOutput;
    const file = this.context.openFiles()[0];
    if (output === null) return;
    this.toggle(true);
    const path = file?.path ?? "program";
    const content = file?.content ?? "";
    this.messages.append(h("p", { class: "assistant-question" }, "Explain this error."));
    // First what the error means in plain words (known errors, at once, right even when the model's text is not);
    // then the model's own explanation, marked as such.
    const plain = await this.client.plainWords(path, content, output).catch(() => null);
    if (plain !== null) {
      this.messages.append(h("div", { class: "assistant-plain" }, h("p", { class: "assistant-label" }, "What the error means"), h("pre", {}, plain)));
      this.messages.append(h("p", { class: "assistant-label" }, "The model's explanation (written by AI: it can be wrong)"));
    }
    const reply = h("div", { class: "assistant-answer" });
    this.messages.append(reply);
    await this.stream(reply, "", (soFar, onText, signal) => this.client.explain(path, content, output, soFar, onText, signal));
  }

  /** Pasted or dropped image files join the next question (checked here first); anything else is left alone. */
  private takeImages(event: Event, data: DataTransfer | null): void {
    const files = imageFiles(data);
    if (!files.length || !this.enabled) return;
    event.preventDefault();
    void this.attach(files);
  }

  private async attach(files: File[]): Promise<void> {
    if (this.model?.sees_images === false) return this.say(CANNOT_SEE);
    const shown = this.conversation.reduce((sum, turn) => sum + (turn.images?.length ?? 0), 0);
    for (const file of files) {
      const full = shown + this.attachments.count >= MAX_IMAGES;
      const why = full ? `A conversation can show the model ${MAX_IMAGES} images at most.` : refusal(file, this.state?.max_image_bytes ?? 0);
      if (why) this.say(why);
      else this.attachments.add(await readDataUrl(file));
    }
    this.input.focus();
  }

  private async ask(): Promise<void> {
    const typed = this.input.value.trim();
    const file = this.context.openFiles()[0];
    if ((!typed && !this.attachments.count) || this.answering) return;
    if (!file) return this.say("Open a file to ask about it.");
    this.input.value = "";
    const images = this.attachments.take();
    const question = typed || IMAGE_QUESTION;
    const turn: ChatTurn = images.length ? { role: "user", content: question, images } : { role: "user", content: question };
    const history = [...this.conversation, turn];
    await this.answer(question, (soFar, onText, signal) => this.client.chat(file.path, file.content, history, soFar, onText, signal), history, images);
  }

  /** Shows the question (with its images) and streams the answer into the panel; a new question stops the old answer. */
  private async answer(question: string, run: Answerer, history?: ChatTurn[], images: string[] = []): Promise<void> {
    if (images.length) this.messages.append(questionImages(images));
    this.messages.append(h("p", { class: "assistant-question" }, question));
    const reply = h("div", { class: "assistant-answer" });
    this.messages.append(reply);
    await this.stream(reply, "", run, history);
  }

  /** Streams (the rest of) an answer into `reply`. One the length cap cut short ends at its last natural stop,
   * with a Continue button that streams the rest into the same answer. */
  private async stream(reply: HTMLElement, soFar: string, run: Answerer, history?: ChatTurn[]): Promise<void> {
    this.answering?.abort();
    const controller = new AbortController();
    this.answering = controller;
    reply.classList.add("streaming");
    let text = soFar && !/\s$/.test(soFar) ? `${soFar} ` : soFar;
    const show = () => {
      reply.replaceChildren(renderMarkdown(text)); // built from text nodes: a model's answer can't inject markup
      this.messages.scrollTop = this.messages.scrollHeight;
    };
    try {
      const finish = await this.whenReady(reply, controller.signal, () =>
        run(soFar || null, (piece) => {
          text += piece;
          show();
        }, controller.signal),
      );
      if (finish === "length") {
        text = naturalEnd(text);
        show();
        const more = h("button", { type: "button", class: "secondary small assistant-continue" }, "Continue");
        more.addEventListener("click", () => {
          more.remove();
          void this.stream(reply, text, run, history);
        });
        reply.append(more);
      }
      if (history) this.conversation = [...history, { role: "assistant", content: text }];
    } catch (error) {
      if (!controller.signal.aborted) reply.textContent = text ? `${text} [stopped: ${this.failed(error)}]` : this.failed(error);
      reply.classList.add("assistant-error");
    } finally {
      reply.classList.remove("streaming", "assistant-waiting");
      if (this.answering === controller) this.answering = null;
    }
  }

  /** Makes the call once the model is ready: while it loads, the reply says so and waits (so does a call that
   * finds it loading: a deferred model's first call starts the load), then the call goes (again). */
  private async whenReady(reply: HTMLElement, signal: AbortSignal, call: () => Promise<FinishReason>): Promise<FinishReason> {
    for (let tries = 1; ; tries++) {
      if (this.model?.state === "loading") {
        reply.classList.add("assistant-waiting");
        reply.replaceChildren(h("p", { class: "status status-info" }, "Waiting for the model to load: the answer starts once it is ready…"));
        const model = await this.settledModel();
        reply.classList.remove("assistant-waiting");
        reply.replaceChildren();
        if (signal.aborted) throw new DOMException("The question was replaced", "AbortError");
        if (model.state !== "ready") throw new Error(model.detail);
      }
      try {
        return await call();
      } catch (error) {
        if (signal.aborted || tries === TRIES || !this.isLoading(error)) throw error;
      }
    }
  }

  private say(text: string): void {
    this.messages.append(h("p", { class: "status status-info" }, text));
  }
}
