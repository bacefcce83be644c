/** Project page: loads the workspace bundle on demand, so sign-in and the dashboard stay small. */
export async function renderProject(root: HTMLElement, projectId: string): Promise<void> {
  const { renderWorkspace } = await import("../workspace/workspace");
  await renderWorkspace(root, projectId);
}
