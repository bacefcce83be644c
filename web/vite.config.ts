import { defineConfig, type Plugin } from "vite";

// @replit/codemirror-emacs registers its key table and commands with calls marked /*@__PURE__*/ whose results are
// unused, so a production build drops them and Emacs mode binds no key at all; unmarking them keeps them.
const keepEmacsKeys: Plugin = {
  name: "keep-emacs-keys",
  transform(code, id) {
    if (!id.includes("@replit/codemirror-emacs")) return null;
    return code.replace(/\/\*@__PURE__\*\/(EmacsHandler\.(bindKey|addCommands)\()/g, "$1");
  },
};

// Assets are built into the Python package and served by FastAPI under /static/.
// The Jinja page shells read .vite/manifest.json to find the hashed file names.
export default defineConfig({
  base: "/static/",
  plugins: [keepEmacsKeys],
  build: {
    outDir: "../ide_server/webassets",
    emptyOutDir: true,
    manifest: "manifest.json",
    // The workspace chunk (CodeMirror, Yjs, xterm) is loaded only on project pages.
    chunkSizeWarningLimit: 1500,
    rollupOptions: { input: "src/main.ts" },
  },
});
