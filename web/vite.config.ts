import { defineConfig } from "vite";

// Assets are built into the Python package and served by FastAPI under /static/.
// The Jinja page shells read .vite/manifest.json to find the hashed file names.
export default defineConfig({
  base: "/static/",
  build: {
    outDir: "../ide_server/webassets",
    emptyOutDir: true,
    manifest: "manifest.json",
    rollupOptions: { input: "src/main.ts" },
  },
});
