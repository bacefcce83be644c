/** The API's types as the pages use them, named from the generated schema.d.ts (`make web-types`
 * writes it from the server's OpenAPI document): a changed route or schema shows up here as a type error. */
import type { components } from "./schema";

type Schemas = components["schemas"];

export type UserPublic = Schemas["UserPublic"];
export type TemplatePublic = Schemas["TemplatePublic"];
export type ProjectPublic = Schemas["ProjectPublic"];
export type LessonProjectPublic = Schemas["LessonProjectPublic"];
export type InvitePreview = Schemas["InvitePreview"];
export type InviteAccepted = Schemas["InviteAccepted"];
export type FileEntry = Schemas["FileEntry"];
export type SearchResults = Schemas["SearchResults"];
export type AssistantPublic = Schemas["AssistantPublic"];
export type ModelStatus = Schemas["ModelStatus"];
