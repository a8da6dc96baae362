"""Declared through the django-tasks backport, as some libraries still do on Django 6.1."""

from django_tasks import task


@task()
def multiply(a, b):
    return a * b
