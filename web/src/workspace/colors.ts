/** A stable colour per user name, so cursors and avatars of one person match everywhere. */
const PALETTE = ["#d9480f", "#2b8a3e", "#1971c2", "#9c36b5", "#c2255c", "#e67700", "#0c8599", "#5f3dc4"];

export function colorFor(name: string): string {
  let hash = 0;
  for (const char of name) hash = (hash * 31 + char.charCodeAt(0)) | 0;
  return PALETTE[Math.abs(hash) % PALETTE.length];
}
