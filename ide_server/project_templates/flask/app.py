from flask import Flask, jsonify, render_template

app = Flask(__name__)


@app.get("/")
def index():
    return render_template("index.html", name="Codeyard")


@app.get("/api/hello")
def hello():
    return jsonify(message="Hello, Codeyard!")


if __name__ == "__main__":
    app.run(host="0.0.0.0", port=8080, debug=True)
