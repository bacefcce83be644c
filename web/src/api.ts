/** A small fetch wrapper: sends the CSRF header on writes and turns errors into sentences. */

export class ApiError extends Error {
  constructor(message: string, readonly status: number) {
    super(message);
  }
}

function csrfToken(): string {
  const match = document.cookie.match(/(?:^|;\s*)codeyard_csrf=([^;]+)/);
  return match ? decodeURIComponent(match[1]) : "";
}

/** Turns FastAPI's error bodies (a string or a list of validation errors) into one readable line. */
function describeError(body: unknown, status: number): string {
  const detail = (body as { detail?: unknown } | null)?.detail;
  if (typeof detail === "string") return detail;
  if (Array.isArray(detail) && detail.length > 0) {
    return detail
      .map((item: { loc?: unknown[]; msg?: string }) => {
        const field = (item.loc ?? []).filter((part) => part !== "body").join(".");
        return field ? `${field}: ${item.msg}` : String(item.msg);
      })
      .join("; ");
  }
  if (status === 401) return "Please sign in first.";
  if (status === 403) return "You don't have permission to do that.";
  if (status === 404) return "That was not found.";
  if (status === 429) return "Too many attempts. Please wait a moment and try again.";
  return "Something went wrong on the server. Please try again.";
}

/** Sends a request and returns the response, or throws an ApiError with a readable message.
 * Aborting `signal` rejects with the fetch's AbortError (the caller moved on; nothing to show). */
export async function send(method: string, path: string, body?: BodyInit, contentType?: string, signal?: AbortSignal): Promise<Response> {
  const headers: Record<string, string> = { Accept: "application/json" };
  if (contentType) headers["Content-Type"] = contentType;
  if (method !== "GET") headers["X-CSRF-Token"] = csrfToken();
  let response: Response;
  try {
    response = await fetch(path, { method, headers, credentials: "same-origin", body, signal });
  } catch (error) {
    if (signal?.aborted) throw error;
    throw new ApiError("Can't reach the Codeyard server. Check your connection.", 0);
  }
  if (!response.ok) {
    const parsed: unknown = await response.json().catch(() => null);
    throw new ApiError(describeError(parsed, response.status), response.status);
  }
  return response;
}

/** A JSON request: the body is serialised and the answer parsed (null when empty). */
export async function api<T>(method: string, path: string, body?: unknown): Promise<T> {
  const response = await send(
    method,
    path,
    body === undefined ? undefined : JSON.stringify(body),
    body === undefined ? undefined : "application/json",
  );
  const text = await response.text();
  return (text ? JSON.parse(text) : null) as T;
}
