/* Symbol visibility for libshardfeed. Only declarations marked SF_API are
 * exported from the shared library; everything else is hidden. */
#ifndef SHARDFEED_EXPORT_H
#define SHARDFEED_EXPORT_H

#if defined(SF_STATIC_DEFINE)
#define SF_API
#elif defined(_WIN32)
#ifdef SF_BUILDING_LIBRARY
#define SF_API __declspec(dllexport)
#else
#define SF_API __declspec(dllimport)
#endif
#elif defined(__GNUC__)
#define SF_API __attribute__((visibility("default")))
#else
#define SF_API
#endif

#endif /* SHARDFEED_EXPORT_H */
