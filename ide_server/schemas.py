"""Request and response bodies of the core API (Create/Update/Public, as in the FastAPI template)."""

from datetime import datetime
from typing import Annotated, Literal

from fastapi import Path
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from ide_server.models import Role, Visibility


def _no_control_characters(value: str) -> str:
    """NUL and other control characters are never meaningful in names (and PostgreSQL refuses NUL)."""
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ValueError("must not contain control characters")
    return value


def _unicode(value: str) -> str:
    """JSON may spell lone surrogates ("\\udcff"), which no UTF-8 file can hold; pydantic lets them into a
    str field without length limits."""
    try:
        value.encode()
    except UnicodeEncodeError:
        raise ValueError("must be valid unicode text (no lone surrogates such as \\udcff)") from None
    return value


Line = Annotated[str, AfterValidator(_no_control_characters)]
Text = Annotated[str, AfterValidator(_unicode)]
Username = Field(min_length=2, max_length=32, pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
Password = Field(min_length=1, max_length=1024)


class Public(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class UserCreate(BaseModel):
    username: str = Username
    password: str = Password


class PasswordChange(BaseModel):
    current_password: str = Field(min_length=1, max_length=1000)
    new_password: str = Password


class LoginRequest(BaseModel):
    username: Line = Field(min_length=1, max_length=100)
    password: str = Password


class UserPublic(Public):
    username: str
    is_admin: bool
    created_at: datetime


class LoginPublic(BaseModel):
    user: UserPublic
    csrf_token: str = Field(description="Send it back in the X-CSRF-Token header on cookie-authenticated writes.")


class TokenCreate(BaseModel):
    name: Line = Field(min_length=1, max_length=100)


class TokenPublic(Public):
    id: str
    name: str
    created_at: datetime
    last_used_at: datetime | None


class TokenCreated(TokenPublic):
    token: str = Field(description="The token itself; shown only now.")


class TemplatePublic(Public):
    id: str
    title: str
    description: str


class ProjectCreate(BaseModel):
    name: Line = Field(min_length=1, max_length=100)
    template: Line = Field(default="python", max_length=32)


class ProjectUpdate(BaseModel):
    name: Line | None = Field(default=None, min_length=1, max_length=100)
    visibility: Visibility | None = None


class ProjectFork(BaseModel):
    name: Line | None = Field(default=None, min_length=1, max_length=100)


class ProjectPublic(Public):
    id: str
    name: str
    template: str
    visibility: Visibility
    forked_from: str | None
    created_at: datetime
    role: Role | None = Field(description="The caller's role; null for a public project they are not a member of.")


class MemberPublic(BaseModel):
    username: str
    role: Role


class MemberUpdate(BaseModel):
    role: Role


class InviteCreate(BaseModel):
    role: Role = Role.viewer


class InvitePublic(Public):
    id: str
    role: Role
    created_at: datetime


class InviteCreated(InvitePublic):
    token: str = Field(description="The secret part of the link; shown only now.")
    url: str = Field(description="Path of the page that accepts the invite.")


class InvitePreview(BaseModel):
    project_name: str
    role: Role


class InviteAccepted(BaseModel):
    project: ProjectPublic


class FileEntry(Public):
    path: str = Field(description="A name on disk the API cannot carry as it is (not UTF-8, control characters, "
                                  "'\\', '%' encoding '..') is shown with those bytes as \\xHH; such a path has a '\\' "
                                  "and can be read, renamed (as the source) or deleted, nothing else.")
    kind: Literal["file", "directory", "symlink"]
    size: int


class FileCreate(BaseModel):
    path: str = Field(min_length=1, max_length=4096)
    kind: Literal["file", "directory"] = "file"
    content: Text = Field(default="", description="UTF-8 text of a new file.")


class FileMove(BaseModel):
    src: str = Field(min_length=1, max_length=4096)
    dst: str = Field(min_length=1, max_length=4096)


class UploadResult(BaseModel):
    files_written: int


class SearchMatch(Public):
    path: str
    line: int = Field(description="1-based")
    column: int = Field(description="1-based, in characters")
    text: str = Field(description="The matching line, cut to 200 characters")


class SearchResults(BaseModel):
    matches: list[SearchMatch]
    truncated: bool = Field(description="There were more matches than shown (at most 500)")


# Path parameters: ids are URL-safe random strings; anything else can't name a row.
RandomId = Annotated[str, Path(pattern=r"^[A-Za-z0-9_-]{1,32}$")]
SecretToken = Annotated[str, Path(pattern=r"^[A-Za-z0-9_-]{1,100}$")]
UsernameParam = Annotated[str, Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$")]
