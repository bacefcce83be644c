/** The deployment panel: status, live URL, releases with rollback, streaming logs, and secrets.
 * Shape of the API: deploy_service/__init__.py. While a release builds or starts, the panel polls
 * the deployment every second and the logs socket streams the build as it happens. */
import { api, ApiError } from "../api";
import { h, showStatus } from "../dom";
import { SecretsEditor } from "./deploysecrets";
import { socketUrl } from "./terminal";

type DeploymentStatus = "deploying" | "running" | "unhealthy" | "stopped" | "failed";
type ReleaseStatus = "building" | "starting" | "live" | "retired" | "failed";

interface Release {
  id: string;
  number: number;
  status: ReleaseStatus;
  kind: string | null;
  message: string;
  can_roll_back: boolean;
  created_at: string;
  finished_at: string | null;
}

interface Deployment {
  slug: string;
  url: string;
  status: DeploymentStatus;
  instances: number;
  healthy_instances: number;
  current_release: Release | null;
  releases: Release[];
}

interface LogFrame {
  type: "log";
  release: string | null;
  stream: "build" | "stdout" | "stderr" | "system";
  data: string;
  time: number;
}

const STATUS_TEXT: Record<DeploymentStatus, string> = {
  deploying: "Deploying…",
  running: "Live",
  unhealthy: "Unhealthy (restarting)",
  stopped: "Stopped",
  failed: "Failed",
};
const MAX_LOG_LINES = 2000;
const MAX_INSTANCES = 4; // deploy_service.detect.MAX_INSTANCES

function inProgress(deployment: Deployment | null): boolean {
  return deployment !== null && (deployment.status === "deploying" || deployment.releases.some((r) => r.status === "building" || r.status === "starting"));
}

/** How serious a log line is: by the level it names (servers log INFO to stderr), else by its stream. */
function severity(frame: LogFrame): "info" | "warning" | "error" {
  const level = /\b(DEBUG|INFO|WARN(?:ING)?|ERROR|CRITICAL|FATAL)\b/.exec(frame.data)?.[1];
  if (level) return level === "DEBUG" || level === "INFO" ? "info" : level.startsWith("WARN") ? "warning" : "error";
  return frame.stream === "stderr" ? "error" : "info";
}

export class DeployPanel {
  readonly element = h("dialog", { id: "deploy-dialog", class: "card dialog wide" });
  /** For the top bar: Deploy (editors), and a badge with the deployment's state that opens the panel (members). */
  readonly button = h("button", { type: "button", id: "deploy", title: "Deploy this project and get a live URL" }, "Deploy");
  readonly badge = h("button", { type: "button", class: "secondary deploy-badge", id: "deploy-state", hidden: "" });
  private readonly statusLine = h("p", { class: "deploy-status", id: "deploy-status", role: "status" });
  private readonly progress = h("progress", { id: "deploy-progress", hidden: "" });
  private readonly link = h("a", { id: "deploy-url", target: "_blank", rel: "noopener", hidden: "" });
  private readonly releases = h("ol", { class: "releases", id: "deploy-releases" });
  private readonly logs = h("pre", { class: "deploy-logs", id: "deploy-logs", "aria-live": "off" });
  private readonly message = h("p", { class: "status", id: "deploy-message" });
  private readonly failure = h("pre", { class: "deploy-failure", id: "deploy-failure", hidden: "" }); // a failed release's log tail
  private readonly deployButton = h("button", { type: "button", id: "deploy-now" }, "Deploy now");
  private readonly stopButton = h("button", { type: "button", class: "secondary", id: "deploy-stop" }, "Stop");
  private readonly instances = h("select", { id: "deploy-instances", "aria-label": "Instances", title: "Instances (round-robin)" });
  private readonly secrets: SecretsEditor | null;
  private readonly base: string;
  private deployment: Deployment | null = null;
  private socket: WebSocket | null = null;
  private logsDenied = false;
  private awaited: string | null = null; // the release a deploy or rollback is waiting for
  private timer: number | undefined;

  constructor(private readonly projectId: string, private readonly canWrite: boolean, isOwner: boolean) {
    this.base = `/api/projects/${encodeURIComponent(projectId)}`;
    this.secrets = canWrite ? new SecretsEditor(projectId, isOwner) : null;
    this.button.hidden = this.deployButton.hidden = this.stopButton.hidden = !canWrite;
    this.button.addEventListener("click", () => void this.deploy());
    this.instances.hidden = !canWrite;
    for (let n = 1; n <= MAX_INSTANCES; n++) this.instances.append(h("option", { value: String(n) }, `${n} instance${n > 1 ? "s" : ""}`));
    this.instances.addEventListener("change", () => void this.scale(Number(this.instances.value)));
    this.deployButton.addEventListener("click", () => void this.deploy());
    this.stopButton.addEventListener("click", () => void this.stop());
    this.badge.addEventListener("click", () => void this.open());
    const close = h("button", { type: "button", class: "secondary", id: "deploy-close" }, "Close");
    close.addEventListener("click", () => this.element.close());
    this.element.addEventListener("close", () => this.closed());
    this.element.append(
      h("h2", {}, "Deployment"),
      h("div", { class: "row deploy-head" }, this.statusLine, this.link, this.progress),
      h("div", { class: "row" }, this.deployButton, this.stopButton, this.instances),
      this.message,
      this.failure,
      h("h3", {}, "Releases"),
      this.releases,
      h("h3", {}, "Logs"),
      canWrite ? this.logs : h("p", { class: "empty", id: "deploy-logs-hidden" }, "The logs are for the project's editors: an app may print what viewers should not see."),
      ...(this.secrets ? [this.secrets.element] : []),
      close,
    );
  }

  /** Shows the badge with the current state (members only: others cannot read deployments). */
  async refreshBadge(): Promise<void> {
    this.badge.hidden = false;
    try {
      this.show(await api<Deployment | null>("GET", `${this.base}/deployment`));
    } catch {
      this.show(null);
    }
  }

  async open(): Promise<void> {
    if (!this.element.open) this.element.showModal();
    await Promise.all([this.load(), this.secrets?.load()]);
  }

  /** Deploys the project as it is now and opens the panel to watch it go live. */
  async deploy(): Promise<void> {
    await this.open();
    this.deployButton.disabled = true;
    showStatus(this.message, "Starting a new release…");
    try {
      const deployment = await api<Deployment>("POST", `${this.base}/deployments`);
      this.awaited = deployment.releases[0]?.id ?? null;
      showStatus(this.message, "Building the new release. The current one keeps serving until the new one is healthy.");
      this.show(deployment);
    } catch (error) {
      showStatus(this.message, (error as ApiError).message, "error");
    } finally {
      this.deployButton.disabled = false;
    }
    this.schedule();
  }

  private async stop(): Promise<void> {
    try {
      this.show(await api<Deployment>("POST", `${this.base}/deployment/stop`));
      showStatus(this.message, "Stopped. Deploy again to bring it back.");
    } catch (error) {
      showStatus(this.message, (error as ApiError).message, "error");
    }
  }

  private async scale(instances: number): Promise<void> {
    try {
      this.show(await api<Deployment>("POST", `${this.base}/deployment/scale`, { instances }));
      showStatus(this.message, `Scaling to ${instances} instance${instances > 1 ? "s" : ""}; new ones serve once healthy.`);
    } catch (error) {
      showStatus(this.message, (error as ApiError).message, "error");
    }
    this.schedule();
  }

  private async rollBack(release: Release): Promise<void> {
    if (!confirm(`Roll back to release #${release.number}? It replaces the live release once healthy.`)) return;
    try {
      this.awaited = release.id;
      showStatus(this.message, `Rolling back to release #${release.number}…`);
      this.show(await api<Deployment>("POST", `${this.base}/deployment/rollback`, { release_id: release.id }));
    } catch (error) {
      showStatus(this.message, (error as ApiError).message, "error");
    }
    this.schedule();
  }

  private async load(): Promise<void> {
    try {
      this.show(await api<Deployment | null>("GET", `${this.base}/deployment`));
    } catch (error) {
      if (error instanceof ApiError && error.status === 404) {
        this.show(null);
      } else {
        showStatus(this.message, (error as ApiError).message, "error");
      }
    }
    this.schedule();
  }

  /** Polls quickly while a release is on its way, slowly otherwise, and not at all when closed. */
  private schedule(): void {
    window.clearTimeout(this.timer);
    if (!this.element.open) return;
    this.timer = window.setTimeout(() => void this.load(), inProgress(this.deployment) ? 1000 : 5000);
  }

  private closed(): void {
    window.clearTimeout(this.timer);
    this.socket?.close(1000);
    this.socket = null;
    void this.refreshBadge(); // the top bar keeps showing the latest state
  }

  private show(deployment: Deployment | null): void {
    this.deployment = deployment;
    const busy = inProgress(deployment);
    this.progress.hidden = !busy;
    this.stopButton.hidden = !this.canWrite || deployment === null || deployment.status === "stopped";
    this.instances.hidden = !this.canWrite || deployment === null;
    if (deployment !== null && document.activeElement !== this.instances) this.instances.value = String(deployment.instances);
    if (deployment !== null && this.element.open && this.canWrite) this.connectLogs();
    if (deployment === null) {
      this.statusLine.textContent = "Not deployed yet.";
      this.statusLine.dataset.status = "none";
      this.link.hidden = true;
      this.badge.dataset.status = "none";
      this.badge.textContent = "○ Not deployed";
      this.releases.replaceChildren(h("li", { class: "empty" }, this.canWrite ? "Press Deploy to publish this project." : "Nothing deployed yet."));
      return;
    }
    const healthy = deployment.instances > 1 ? ` · ${deployment.healthy_instances}/${deployment.instances} instances healthy` : "";
    this.statusLine.textContent = `${STATUS_TEXT[deployment.status]}${healthy}`;
    this.statusLine.dataset.status = deployment.status;
    const url = new URL(deployment.url, location.href).href;
    this.link.href = url;
    this.link.textContent = url;
    this.link.hidden = deployment.status !== "running" && deployment.status !== "unhealthy";
    this.badge.dataset.status = deployment.status;
    this.badge.textContent = `● ${STATUS_TEXT[deployment.status]}`;
    this.releases.replaceChildren(...deployment.releases.map((release) => this.item(release, deployment.current_release?.id === release.id)));
    this.reportAwaited(deployment);
  }

  /** Says how the release a deploy or rollback started turned out, once it has. */
  private reportAwaited(deployment: Deployment): void {
    const release = deployment.releases.find((r) => r.id === this.awaited);
    if (!release || (release.status !== "live" && release.status !== "failed" && !(release.status === "retired" && release.message))) return;
    this.awaited = null;
    this.failure.hidden = release.status === "live" || !release.message;
    this.failure.textContent = release.message; // its lines as lines, not one paragraph
    if (release.status === "live") showStatus(this.message, `Release #${release.number} is live.`);
    else showStatus(this.message, `Release #${release.number} failed${release.message ? "" : " (see the logs)"}. The previous release keeps serving.`, "error");
  }

  private item(release: Release, current: boolean): HTMLElement {
    const when = new Date(release.created_at).toLocaleString();
    const item = h(
      "li",
      { "data-release": release.id, "data-status": release.status },
      h("strong", {}, `#${release.number}`),
      h("span", { class: `badge release-${release.status}` }, current ? `${release.status} · serving` : release.status),
      h("span", { class: "release-text", title: release.message }, [release.kind, release.message].filter(Boolean).join(" · ")),
      h("small", {}, when),
    );
    if (this.canWrite && release.can_roll_back && !current) {
      const back = h("button", { type: "button", class: "small rollback" }, "Roll back");
      back.addEventListener("click", () => void this.rollBack(release));
      item.append(back);
    }
    return item;
  }

  // ----- logs -----

  /** Follows the deployment's log (there is none before the first deploy: 4404, retried on the next show). */
  private connectLogs(attempt = 0): void {
    if (this.socket || this.logsDenied) return;
    const socket = new WebSocket(socketUrl(`/ws/projects/${encodeURIComponent(this.projectId)}/deployment/logs`));
    this.socket = socket;
    socket.onopen = () => {
      attempt = 0;
      this.logs.replaceChildren(); // the server replays the kept tail first
    };
    socket.onmessage = (message) => this.appendLog(JSON.parse(String(message.data)) as LogFrame);
    socket.onclose = (event) => {
      if (this.socket !== socket) return;
      this.socket = null;
      if (event.code === 4404) return;
      if (event.code >= 4400 && event.code < 4500) {
        this.logsDenied = true;
        return showStatus(this.message, event.reason || "No access to the logs.", "error");
      }
      if (this.element.open) window.setTimeout(() => this.element.open && this.connectLogs(attempt + 1), Math.min(5000, 500 * 2 ** attempt));
    };
  }

  private appendLog(frame: LogFrame): void {
    if (frame.type !== "log") return;
    const atBottom = this.logs.scrollTop + this.logs.clientHeight >= this.logs.scrollHeight - 4;
    this.logs.append(h("span", { class: `log-${frame.stream} log-${severity(frame)}` }, frame.data.endsWith("\n") ? frame.data : `${frame.data}\n`));
    while (this.logs.childElementCount > MAX_LOG_LINES) this.logs.firstElementChild?.remove();
    if (atBottom) this.logs.scrollTop = this.logs.scrollHeight;
    if (inProgress(this.deployment) && frame.stream === "system") void this.load();
  }
}
