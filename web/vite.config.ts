import { defineConfig } from "vite";

// Assets are built into the Python package and served by FastAPI under /static/.
// The Jinja page shells read .vite/manifest.json to find the hashed file names.
export default defineConfig({
  base: "/static/",
  build: {
    outDir: "../ide_server/webassets",
    emptyOutDir: true,
    manifest: "manifest.json",
    // The workspace chunk (CodeMirror, Yjs, xterm) is loaded only on project pages.
    chunkSizeWarningLimit: 1500,
    rollupOptions: { input: "src/main.ts" },
  },
});
