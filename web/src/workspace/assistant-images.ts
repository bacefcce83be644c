/** Images in the assistant's chat: a pasted or dropped picture (a plot, an error dialog, a sketch) is checked here
 * (type, size, how many) before it is read as a data: URL and sent with the next question. The server checks it
 * again, and refuses it when its model is text-only; the panel says so before anything is sent when it knows. */
import { h } from "../dom";

const IMAGE_TYPES = ["image/png", "image/jpeg", "image/webp", "image/gif"];
export const MAX_IMAGES = 4; // in one conversation, as the server allows: each answer shows the model all of them
export const CANNOT_SEE = "The assistant's model reads text only: it cannot see images. Describe the picture in words, or paste the text of the error.";

/** The image files among pasted or dropped things (text is left to the textarea). */
export function imageFiles(data: DataTransfer | null): File[] {
  return [...(data?.files ?? [])].filter((file) => file.type.startsWith("image/"));
}

function megabytes(bytes: number): string {
  return `${(bytes / 1024 / 1024).toFixed(1)} MB`;
}

/** Why `file` cannot be sent, or null when it can. */
export function refusal(file: File, maxBytes: number): string | null {
  const name = file.name || "The image";
  if (!IMAGE_TYPES.includes(file.type)) return `${name} is ${file.type}: the assistant takes PNG, JPEG, WebP and GIF images.`;
  if (file.size > maxBytes) return `${name} is ${megabytes(file.size)}: images up to ${megabytes(maxBytes)} can be sent.`;
  return null;
}

export function readDataUrl(file: File): Promise<string> {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result as string);
    reader.onerror = () => reject(reader.error ?? new Error("the image could not be read"));
    reader.readAsDataURL(file);
  });
}

function thumbnail(url: string, index: number): HTMLImageElement {
  return h("img", { src: url, alt: `Image ${index + 1}`, class: "assistant-thumb" });
}

/** A question's images, shown above it in the conversation. */
export function questionImages(urls: string[]): HTMLElement {
  return h("div", { class: "assistant-question-images" }, ...urls.map(thumbnail));
}

/** The images waiting to go with the next question, as thumbnails with a remove button each. */
export class Attachments {
  readonly strip = h("div", { class: "assistant-attachments", id: "assistant-attachments", hidden: "" });
  private urls: string[] = [];

  get count(): number {
    return this.urls.length;
  }

  add(url: string): void {
    this.urls.push(url);
    this.render();
  }

  /** The images, handed over to a question (the strip empties). */
  take(): string[] {
    const urls = this.urls;
    this.urls = [];
    this.render();
    return urls;
  }

  private render(): void {
    this.strip.hidden = this.urls.length === 0;
    this.strip.replaceChildren(
      ...this.urls.map((url, index) => {
        const remove = h("button", { type: "button", class: "secondary small", "aria-label": `Remove image ${index + 1}` }, "×");
        remove.addEventListener("click", () => {
          this.urls.splice(index, 1);
          this.render();
        });
        return h("span", { class: "assistant-attachment" }, thumbnail(url, index), remove);
      }),
    );
  }
}
