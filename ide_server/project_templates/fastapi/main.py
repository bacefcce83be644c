from fastapi import FastAPI

app = FastAPI(title="My API")


@app.get("/")
def hello() -> dict[str, str]:
    return {"message": "Hello, Codeyard!"}


@app.get("/items/{item_id}")
def read_item(item_id: int, q: str | None = None) -> dict[str, object]:
    return {"item_id": item_id, "q": q}
