/** The share dialog: invite links with a role, the member list (owners change or remove roles), public/private. */
import { api, ApiError } from "../api";
import { h, showStatus } from "../dom";

interface Member {
  username: string;
  role: "owner" | "editor" | "viewer";
}

interface InviteCreated {
  url: string;
  role: string;
}

export interface ShareProject {
  id: string;
  visibility: "private" | "public";
  role: "owner" | "editor" | "viewer" | null;
}

const ROLES = ["viewer", "editor", "owner"] as const;

function roleSelect(current: string, label: string): HTMLSelectElement {
  const select = h("select", { "aria-label": label });
  select.append(...ROLES.map((role) => h("option", { value: role }, role)));
  select.value = current;
  return select;
}

export class ShareDialog {
  readonly element = h("dialog", { id: "share-dialog", class: "card dialog" });
  private readonly status = h("p", { class: "status" });
  private readonly members = h("ul", { class: "members", id: "members" });
  private readonly base: string;

  constructor(private readonly project: ShareProject, private readonly me: string) {
    this.base = `/api/projects/${encodeURIComponent(project.id)}`;
    const isOwner = project.role === "owner";
    const close = h("button", { type: "button", class: "secondary", id: "share-close" }, "Close");
    close.addEventListener("click", () => this.element.close());
    this.element.append(h("h2", {}, "Share this project"));
    if (isOwner) this.element.append(this.visibilityToggle(), this.inviteForm());
    this.element.append(h("h3", {}, "People"), this.members, this.status, close);
  }

  async open(): Promise<void> {
    this.element.showModal();
    await this.loadMembers();
  }

  private fail(error: unknown): void {
    showStatus(this.status, error instanceof ApiError ? error.message : String(error), "error");
  }

  private visibilityToggle(): HTMLElement {
    const toggle = h("input", { type: "checkbox", id: "public-toggle" });
    toggle.checked = this.project.visibility === "public";
    toggle.addEventListener("change", async () => {
      const visibility = toggle.checked ? "public" : "private";
      try {
        await api("PATCH", this.base, { visibility });
        this.project.visibility = visibility;
        showStatus(this.status, visibility === "public" ? "Anyone with the link can now watch this project (read-only)." : "Only members can open this project now.");
      } catch (error) {
        toggle.checked = !toggle.checked;
        this.fail(error);
      }
    });
    return h("label", { class: "inline" }, toggle, "Public: anyone with the link can watch, read-only");
  }

  private inviteForm(): HTMLElement {
    const role = roleSelect("editor", "Role for the invite link");
    const create = h("button", { type: "button", id: "create-invite" }, "Create invite link");
    const link = h("input", { readonly: "", id: "invite-link", "aria-label": "Invite link", placeholder: "The link appears here" });
    create.addEventListener("click", async () => {
      try {
        const invite = await api<InviteCreated>("POST", `${this.base}/invites`, { role: role.value });
        link.value = `${location.origin}${invite.url}`;
        link.select();
        await navigator.clipboard?.writeText(link.value).catch(() => undefined);
        showStatus(this.status, `Invite link for a new ${invite.role} created. Send it to the person you want to invite.`);
      } catch (error) {
        this.fail(error);
      }
    });
    return h("div", { class: "invite" }, h("h3", {}, "Invite with a link"), h("div", { class: "row" }, role, create), link);
  }

  private async loadMembers(): Promise<void> {
    let members: Member[];
    try {
      members = await api<Member[]>("GET", `${this.base}/members`);
    } catch (error) {
      return this.fail(error);
    }
    const isOwner = this.project.role === "owner";
    this.members.replaceChildren(
      ...members.map((member) => {
        const item = h("li", { "data-username": member.username }, h("span", { class: "member-name" }, member.username + (member.username === this.me ? " (you)" : "")));
        if (!isOwner) {
          item.append(h("span", { class: "badge" }, member.role));
          return item;
        }
        const select = roleSelect(member.role, `Role of ${member.username}`);
        select.addEventListener("change", async () => {
          try {
            await api("PATCH", `${this.base}/members/${encodeURIComponent(member.username)}`, { role: select.value });
            showStatus(this.status, `${member.username} is now ${select.value}.`);
          } catch (error) {
            select.value = member.role;
            this.fail(error);
          }
        });
        const remove = h("button", { type: "button", class: "danger small remove-member" }, "Remove");
        remove.addEventListener("click", async () => {
          if (!confirm(`Remove ${member.username} from this project?`)) return;
          try {
            await api("DELETE", `${this.base}/members/${encodeURIComponent(member.username)}`);
            showStatus(this.status, `${member.username} was removed.`);
            await this.loadMembers();
          } catch (error) {
            this.fail(error);
          }
        });
        item.append(select, remove);
        return item;
      }),
    );
  }
}
