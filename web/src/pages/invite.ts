/** Invite page: shows which project and role a link grants, and accepts it. */
import { api, ApiError } from "../api";
import type { InviteAccepted, InvitePreview } from "../api/types";
import { h, showStatus } from "../dom";

export async function renderInvite(root: HTMLElement, token: string): Promise<void> {
  const status = h("p", { class: "status" });
  const card = h("div", { class: "card auth" }, h("h1", {}, "Project invitation"), status);
  root.replaceChildren(card);
  let preview: InvitePreview;
  try {
    preview = await api<InvitePreview>("GET", `/api/invites/${encodeURIComponent(token)}`);
  } catch (error) {
    showStatus(status, (error as ApiError).message, "error");
    return;
  }
  const accept = h("button", { type: "button" }, "Join project");
  card.insertBefore(h("p", {}, `You are invited to “${preview.project_name}” as ${preview.role}.`), status);
  card.insertBefore(accept, status);
  accept.addEventListener("click", async () => {
    try {
      const accepted = await api<InviteAccepted>("POST", `/api/invites/${encodeURIComponent(token)}/accept`);
      location.assign(`/projects/${accepted.project.id}`);
    } catch (error) {
      if (error instanceof ApiError && error.status === 401) location.assign(`/login?next=${encodeURIComponent(location.pathname)}`);
      else showStatus(status, (error as ApiError).message, "error");
    }
  });
}
