/** Tiny DOM helpers so pages stay declarative without a framework. */

export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  props: Partial<Record<string, string>> = {},
  ...children: (Node | string)[]
): HTMLElementTagNameMap[K] {
  const element = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (value !== undefined) element.setAttribute(key, value);
  }
  element.append(...children);
  return element;
}

/** Shows a message in the page's status line; errors are announced to screen readers. */
export function showStatus(target: HTMLElement, message: string, kind: "error" | "info" = "info"): void {
  target.textContent = message;
  target.className = `status status-${kind}`;
  target.setAttribute("role", kind === "error" ? "alert" : "status");
}
