function greet(name) {
  return `Hello, ${name}!`;
}

console.log(greet("Codeyard"));
