"""URLs for the admin tests: the admin site, and static files for the browser tests.

Used through ``@pytest.mark.urls("tests.browser.urls")``. The live server of
pytest-django serves static files only when staticfiles is installed when the
server starts, so the admin's CSS and JavaScript are served here as well.
"""

from django.contrib import admin
from django.contrib.staticfiles.views import serve
from django.urls import include, path, re_path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("rdbtasks/", include("django_rdbtasks.urls")),
    re_path(r"^static/(?P<path>.*)$", serve, {"insecure": True}),
]
