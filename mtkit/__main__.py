from mtkit.cli import app

app(prog_name="mtkit")
