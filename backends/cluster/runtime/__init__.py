"""Ray plumbing every other room leans on: joining or starting Ray (`connection`, `embedded`),
where actors go (`placement`), and Ray's errors as the typed error tree (`errors`)."""
