/** The Webview: the page a run's web app serves, in a frame, for every member following the run.
 * The server proxies /preview/{token}/ to the run (its own opaque origin, as deployed apps). */
import { h } from "../dom";

export class WebviewPane {
  readonly tab = h("button", { type: "button", class: "pane-tab", id: "webview-tab", hidden: "" }, "Webview");
  private readonly frame = h("iframe", {
    id: "webview-frame",
    title: "Webview of the running program",
    sandbox: "allow-scripts allow-forms allow-popups allow-modals allow-downloads",
    referrerpolicy: "no-referrer",
  });
  private readonly address = h("span", { class: "webview-address", id: "webview-address" });
  private readonly openLink = h("a", { id: "webview-open", target: "_blank", rel: "noopener noreferrer" }, "Open in new tab ↗");
  private readonly reload = h("button", { type: "button", class: "secondary", id: "webview-reload", title: "Reload the page" }, "↻");
  readonly element = h(
    "div",
    { class: "webview", id: "webview", hidden: "" },
    h("div", { class: "webview-bar" }, this.reload, this.address, this.openLink),
    this.frame,
  );
  private url: string | null = null;

  constructor(private readonly reveal: () => void) {
    this.reload.addEventListener("click", () => {
      if (this.url) this.frame.src = this.url;
    });
  }

  /** The followed run serves on `port` at `url` (null: it no longer does). The first time, the pane comes to the front. */
  show(url: string | null, port: number | null): void {
    if (url === this.url) return;
    const first = this.url === null && url !== null;
    this.url = url;
    if (url === null) {
      this.address.textContent = "The program stopped serving. Run it again to see its page.";
      this.openLink.hidden = true;
      return;
    }
    this.tab.hidden = false;
    this.tab.textContent = `Webview :${port}`;
    this.address.textContent = `Port ${port}`;
    this.openLink.hidden = false;
    this.openLink.href = url;
    this.frame.src = url;
    if (first) this.reveal();
  }
}
