"""Property-based run of the OpenAPI schema (schemathesis): no input makes the server answer 5xx,
invalid inputs are refused with 4xx, and answers match the documented statuses, schemas and
content types.

Every operation of the core API (/api and the health probes) in /api/openapi.json gets
generated valid and invalid inputs (hypothesis, bounded examples), sent authenticated as a user
who owns a project; `project_id` path parameters point at that project so the inputs reach the
real handlers. (Other components' operations, such as the LLM's /v1, are fuzzed by their own tests.)
"""

import os

import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

EXAMPLES_PER_OPERATION = 30 if os.environ.get("CODEYARD_LONG") else 10  # make test-long: 30
CORE_PATHS = ("/api/", "/healthz", "/readyz")
# Installs real packages from PyPI for every valid name (and is off where the test's data dir isn't
# reachable by sandbox uids); tests/sandbox_packages covers its validation and its installs.
NETWORK_OPERATIONS = {("POST", "/api/projects/{project_id}/packages")}
# Load and run the LLM for every valid body (minutes of CPU per example on the test machine);
# tests/assistant covers their validation, rules and answers with the real model.
MODEL_OPERATIONS = {("POST", f"/api/projects/{{project_id}}/assistant/{name}") for name in ("complete", "explain", "chat")}
CHECKS = [not_a_server_error, negative_data_rejection, status_code_conformance, response_schema_conformance,
          content_type_conformance]
# Zip uploads are raw bytes, like application/octet-stream.
schemathesis.serializer.alias("application/zip", "application/octet-stream")


def fuzz_user(app) -> tuple[dict, str]:
    client = TestClient(app)
    csrf = client.post("/api/auth/register", json={"username": "fuzzer", "password": "fuzzing-pw"}).json()["csrf_token"]
    headers = {"X-CSRF-Token": csrf}
    token = client.post("/api/tokens", json={"name": "fuzz"}, headers=headers).json()["token"]
    project = client.post("/api/projects", json={"name": "fuzz", "template": "flask"}, headers=headers).json()["id"]
    return {"Authorization": f"Bearer {token}"}, project


def test_no_generated_input_causes_a_server_error(app):
    headers, project_id = fuzz_user(app)
    schema = schemathesis.openapi.from_asgi("/api/openapi.json", app)
    failures: list[str] = []
    operations = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        if not operation.path.startswith(CORE_PATHS) or (operation.method.upper(), operation.path) in NETWORK_OPERATIONS | MODEL_OPERATIONS:
            continue
        operations += 1
        fixed = {}
        deleting_the_project = operation.method.upper() == "DELETE" and operation.path == "/api/projects/{project_id}"
        if "{project_id}" in operation.path and not deleting_the_project:
            fixed["project_id"] = project_id
        strategy = st.one_of(
            operation.as_strategy(GenerationMode.POSITIVE, path_parameters=fixed),
            operation.as_strategy(GenerationMode.NEGATIVE, path_parameters=fixed),
        )

        @given(case=strategy)
        @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        def run(case):
            response = case.call(headers=headers)
            case.validate_response(response, checks=CHECKS)

        try:
            run()
        except Exception as exc:  # collect every failing operation, then report them all
            failures.append(f"{operation.method.upper()} {operation.path}: {str(exc)[:1500]}")
    assert operations >= 25
    assert not failures, "\n\n".join(failures)
