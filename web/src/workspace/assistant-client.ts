/** The assistant API: the model's status, the project's switch, ghost-text completions, and streamed answers. */
import { api, send } from "../api";
import type { AssistantPublic, ModelStatus } from "../api/types";
import { editorSettings, indentText } from "../settings";

export type AssistantState = AssistantPublic;
export type { ModelStatus };

export interface OpenFile {
  path: string;
  content: string;
}

/** Why an answer ended: "length" when the server's cap cut it short (it can be continued). */
export type FinishReason = "stop" | "length" | null;

export interface ChatTurn {
  role: "user" | "assistant";
  content: string;
  /** The user's images (data: URLs), for a model that sees images. */
  images?: string[];
}

export class AssistantClient {
  private readonly base: string;

  constructor(projectId: string) {
    this.base = `/api/projects/${encodeURIComponent(projectId)}/assistant`;
  }

  state(): Promise<AssistantState> {
    return api<AssistantState>("GET", this.base);
  }

  /** The model's status alone (the same for every project), polled while it loads. */
  model(): Promise<ModelStatus> {
    return api<ModelStatus>("GET", "/api/assistant/model");
  }

  setEnabled(enabled: boolean): Promise<AssistantState> {
    return api<AssistantState>("PUT", this.base, { enabled });
  }

  async complete(path: string, prefix: string, suffix: string, openFiles: OpenFile[], signal: AbortSignal): Promise<string> {
    const indent = indentText(editorSettings()); // the suggestion comes back indented as the editor indents
    const body = JSON.stringify({ path, prefix, suffix, open_files: openFiles, indent });
    const response = await send("POST", `${this.base}/complete`, body, "application/json", signal);
    return ((await response.json()) as { text: string }).text;
  }

  /** The failed run's error in plain words (the grader's explanation), or null when it holds none the IDE knows. */
  async plainWords(path: string, content: string, output: string): Promise<string | null> {
    return (await api<{ text: string | null }>("POST", `${this.base}/plain-words`, { path, content, output })).text;
  }

  /** Streams an explanation (or, given the answer so far, the rest of it); resolves to why it ended. */
  explain(path: string, content: string, output: string, soFar: string | null, onText: (text: string) => void, signal: AbortSignal): Promise<FinishReason> {
    return this.stream("explain", { path, content, output, continue_answer: soFar }, onText, signal);
  }

  chat(path: string, content: string, messages: ChatTurn[], soFar: string | null, onText: (text: string) => void, signal: AbortSignal): Promise<FinishReason> {
    return this.stream("chat", { path, content, messages, continue_answer: soFar }, onText, signal);
  }

  /** Reads the server-sent chat chunks, handing each piece of text to `onText` as it arrives. */
  private async stream(route: string, body: unknown, onText: (text: string) => void, signal: AbortSignal): Promise<FinishReason> {
    const response = await send("POST", `${this.base}/${route}`, JSON.stringify(body), "application/json", signal);
    const reader = response.body!.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    let finish: FinishReason = null;
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return finish;
      buffer += value;
      const events = buffer.split("\n\n");
      buffer = events.pop() ?? "";
      for (const event of events) {
        const data = event.replace(/^data: /, "");
        if (data === "[DONE]") return finish;
        const chunk = JSON.parse(data) as { error?: { message: string }; choices?: { delta: { content?: string }; finish_reason?: FinishReason }[] };
        if (chunk.error) throw new Error(chunk.error.message);
        const text = chunk.choices?.[0]?.delta.content;
        if (text) onText(text);
        finish = chunk.choices?.[0]?.finish_reason ?? finish;
      }
    }
  }
}
