// The lmt extension: starts `lmt lsp` and lets vscode-languageclient speak
// to it over stdio. Highlighting comes from syntaxes/lmt.tmLanguage.json.
const vscode = require("vscode");
const { LanguageClient } = require("vscode-languageclient/node");

let client;

function activate(context) {
  const command = vscode.workspace.getConfiguration("lmt").get("path") || "lmt";
  const server = { command, args: ["lsp"] };
  client = new LanguageClient(
    "lmt",
    "lmt language server",
    { run: server, debug: server },
    { documentSelector: [{ scheme: "file", language: "lmt" }, { scheme: "untitled", language: "lmt" }] }
  );
  context.subscriptions.push({ dispose: () => client && client.stop() });
  return client.start();
}

function deactivate() {
  return client ? client.stop() : undefined;
}

module.exports = { activate, deactivate };
